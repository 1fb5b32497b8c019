"""Which fields a (GPU generation, stack) pair sets over the Calibration defaults, and the source
line that says where they came from: a pure function of the calibration data
(:mod:`meshplan.cost.calib_records`), applied by ``calibration.calibration_for``.

Order, later wins: the hardware fields of a record borrowed from another stack of the same
generation, or, where the generation has no such lender, the GEMM fields carried from a record of
another generation (cost/generation_transfer.py), and the attention efficiency of the stack's
kernel on this generation with its published rate curve where the table has one (all only when the pair has no record of its own), then the stack's
mechanisms, then the pair's record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshplan.cost.attention_kernels import kernel_efficiency
from meshplan.cost.calib_records import FittedRecord, StackRecord, record_key
from meshplan.cost.generation_transfer import Transfer, carried_fields
from meshplan.errors import MeshplanError


@dataclass(frozen=True)
class ResolvedCalibration:
    values: Mapping[str, Any]
    """Calibration fields over the defaults."""
    source: str


def resolve_calibration(generation: str, stack: str, *, fitted: Mapping[str, FittedRecord],
                        stacks: Mapping[str, StackRecord], lenders: tuple[str, ...],
                        stack_fields: tuple[str, ...], default_kernel: str,
                        transfers: Mapping[str, Transfer] | None = None) -> ResolvedCalibration:
    """The fields of ``stack`` on ``generation`` (see the module's docstring); ``stack_fields``
    are never borrowed from a lender, ``default_kernel`` is the attention kernel of a stack that
    names none, ``transfers`` the cross-generation GEMM transfers by target generation."""
    if stack not in stacks:
        raise MeshplanError(f"unknown stack {stack!r}; known: {', '.join(stacks)}")
    values: dict[str, Any] = {}
    sources: list[str] = []
    own = fitted.get(record_key(generation, stack))
    if own is None:
        lender = next((fitted[k] for k in lenders if k.split("/")[0] == generation and k in fitted), None)
        if lender is not None:
            values.update({k: v for k, v in lender.values.items() if k not in stack_fields})
            sources.append(f"{lender.source} (hardware fields of {lender.key})")
        elif transfers and generation in transfers:
            carried = carried_fields(transfers[generation], fitted)
            values.update({k: v for k, v in carried.values.items() if k not in stack_fields})
            sources.append(carried.source)
        kernel = stacks[stack].values.get("attention_kernel", default_kernel)
        entry = kernel_efficiency(generation, kernel)
        if entry is not None:  # the kernel's efficiency and curve, not another stack's kernel's (the lender's)
            values.update(entry.fields())
            curve = " and its published curve" if entry.curve else ""
            sources.append(f"attention_efficiency{curve} of {kernel} on {entry.generation} (attention kernel table)")
    values.update(stacks[stack].values)
    sources.append(f"{stack} stack mechanisms")
    if own is not None:
        values.update(own.values)
        sources.insert(0, own.source)
    source = "; ".join(sources) if own is not None or len(sources) > 1 else f"defaults; {stack} stack mechanisms"
    return ResolvedCalibration(values=values, source=source)
