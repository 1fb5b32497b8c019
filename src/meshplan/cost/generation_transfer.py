"""GEMM fields carried from a record fitted on one GPU generation to another (data:
spec/presets/generation_transfer.json): a pure reading of the file, applied by
:mod:`meshplan.cost.stack_resolution` to a (generation, stack) that has neither a fitted record
nor a lender of its own generation.

The carried ``matmul_efficiency`` keeps the fitted record's share of the best-shaped GEMM's rate
(the maximum achievable matmul FLOPs, MAMF: Bekman, Machine Learning Engineering, 'Maximum
Achievable Matmul FLOPS'): ``e_to = e_from x mamf_to / mamf_from``, each ``mamf`` a fraction of
its GPU's dense bf16 peak. An H100 SXM's cuBLAS reaches 80.1% of its peak where an A100 SXM's
reaches 85.9%, so Hopper's torch stacks get 0.65 x 0.801 / 0.859 = 0.61 of the Ampere Megatron
fit's 0.65 (whose GEMMs were cuBLAS too, without Transformer Engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from meshplan.cost.calib_records import FittedRecord
from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json

TRANSFER_FILE = "presets/generation_transfer.json"
"""The transfers and the measured GEMM maxima they scale by (under meshplan.spec)."""

SCALED_BY_MAMF = ("matmul_efficiency",)
"""Fields that are a fraction of the dense peak, hence scaled by the two generations' MAMF
fractions; any other carried field (matmul_half_dim: a tile size) is carried as fitted."""


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """What ``generation`` carries from the record ``lender`` of another generation."""

    generation: str
    lender: str
    """Record key 'generation/stack' in calibration_fitted.json, e.g. 'ampere/megatron'."""
    fields: tuple[str, ...]
    mamf_ratio: float
    """MAMF fraction of ``generation`` over the lender generation's."""
    source: str


@dataclass(frozen=True)
class Carried:
    values: Mapping[str, Any]
    source: str


@lru_cache(maxsize=1)
def generation_transfers() -> Mapping[str, Transfer]:
    """The file's transfers by generation, each with its MAMF ratio."""
    data = shipped_json("meshplan.spec", TRANSFER_FILE)
    mamf = {gen: entry["mamf_flops"] / entry["peak_flops"] for gen, entry in data["mamf"].items()}
    for gen, fraction in mamf.items():
        if not 0 < fraction <= 1:
            raise MeshplanError(f"{TRANSFER_FILE}: mamf of {gen} is {fraction:.3f} of its peak, not in (0, 1]")
    out = {}
    for gen, entry in data["transfers"].items():
        lender_gen = entry["from"].split("/")[0]
        missing = [g for g in (gen, lender_gen) if g not in mamf]
        if missing or lender_gen == gen:
            raise MeshplanError(f"{TRANSFER_FILE}: transfer to {gen} from {entry['from']}: "
                                f"{'no mamf for ' + ', '.join(missing) if missing else 'same generation'}")
        out[gen] = Transfer(generation=gen, lender=entry["from"], fields=tuple(entry["fields"]),
                            mamf_ratio=mamf[gen] / mamf[lender_gen], source=entry["source"])
    return MappingProxyType(out)


def carried_fields(transfer: Transfer, fitted: Mapping[str, FittedRecord]) -> Carried:
    """The fields ``transfer`` carries from its lender's fitted record (a field the record does
    not set is not carried: the defaults stand)."""
    record = fitted.get(transfer.lender)
    if record is None:
        raise MeshplanError(f"{TRANSFER_FILE}: {transfer.generation} carries from {transfer.lender}, "
                            "which has no fitted record")
    values = {f: record.values[f] * (transfer.mamf_ratio if f in SCALED_BY_MAMF else 1.0)
              for f in transfer.fields if f in record.values}
    return Carried(values=MappingProxyType(values),
                   source=f"{', '.join(values)} of {transfer.lender}, matmul_efficiency x {transfer.mamf_ratio:.3f} "
                          f"(the GEMM maximum of {transfer.generation} over the lender's: {TRANSFER_FILE})")
