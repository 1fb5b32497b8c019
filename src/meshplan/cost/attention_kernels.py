"""The attention core's efficiency per (GPU generation, fused attention kernel), as data.

A training stack names the kernel it runs (``Calibration.attention_kernel``, a stack field); the
table (``KERNELS_FILE``, each entry with its source: FlashAttention-2 on A100, Dao 2023 Sec. 4.1;
FlashAttention-2 vs -3 and cuDNN on H100, Shah et al. 2024; FlashAttention-4 vs cuDNN on B200)
gives the ``attention_efficiency`` every (generation, stack) starts from, in
``cost.calibration.calibration_for`` and in a fit (calib/fit.py ``fit_start``); a fitted record
overrides it only where the fit moved it (cost/stack_resolution.py). Issue 14, item 4.

Where a kernel's rate by sequence length, head dim and mask is published for a generation (H100:
FlashAttention-2, -3 and cuDNN, Shah et al. 2024 Figs. 5-6), the entry also carries its
``figure_points`` (TFLOP/s hand-read from the figure) and its ``curve``: the falloff fields of
cost/mixers.attention_core_efficiency (head dim, sequence, causal mask, the backward's ratio and
falloff) that reproduce those points (bench/attention_curves.py; tests/planner/
test_attention_kernels.py checks every point). The curve replaces the Calibration defaults, which
are FlashAttention-3's shape, for a stack running that kernel on that generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json

KERNELS_FILE = "presets/attention_kernels.json"
"""The kernels and their efficiency per generation, with sources (under meshplan.spec)."""

CURVE_FIELDS = ("attention_half_head_dim", "attention_half_seq", "attention_half_seq_causal",
                "attention_backward_ratio", "attention_backward_half_seq", "attention_backward_half_seq_causal")
"""The Calibration fields a kernel's published curve may set (cost/mixers.py's falloffs)."""

BACKWARD_FLOP_RATIO = 2.5
"""FLOPs of the attention backward over the forward as the kernel papers count them: five
matmuls against two (Dao 2023 Sec. 4.1; Shah et al. 2024 Sec. 4.1, flash-attn's benchmarks):
a backward figure's TFLOP/s is 2.5 x the forward FLOPs over the backward's time."""


@dataclass(frozen=True, kw_only=True)
class KernelEfficiency:
    """One table entry: the attention core's efficiency of ``kernel`` on ``generation``."""

    generation: str
    """The generation whose entry this is (a borrowing generation's lender)."""
    kernel: str
    attention_efficiency: float
    source: str
    curve: tuple[tuple[str, float], ...] = ()
    """(field, value) of the kernel's published rate curve (CURVE_FIELDS), empty: the defaults."""

    def fields(self) -> dict[str, float]:
        """The Calibration fields this entry sets: the efficiency and its curve."""
        return {"attention_efficiency": self.attention_efficiency, **dict(self.curve)}


@lru_cache(maxsize=1)
def _raw() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", KERNELS_FILE)


def kernel_names() -> tuple[str, ...]:
    """The attention kernels a stack may name ('fa2', 'fa3', 'fa4', 'fa1-triton', 'cudnn')."""
    return tuple(_raw()["kernels"])


def check_kernel(kernel: str) -> None:
    """Raise MeshplanError naming the known kernels if ``kernel`` is not one of them."""
    if kernel not in _raw()["kernels"]:
        raise MeshplanError(f"unknown attention kernel {kernel!r}; known: {', '.join(kernel_names())}")


def kernel_efficiency(generation: str, kernel: str) -> KernelEfficiency | None:
    """The table's entry for ``kernel`` on ``generation`` (through the generation's lender in
    'borrows'), or None where the literature gives none (the caller keeps its default)."""
    check_kernel(kernel)
    table = _raw()["efficiency"]
    gen = _raw()["borrows"].get(generation, generation)
    entry = table.get(gen, {}).get(kernel)
    if entry is None:
        return None
    if "scaled_from" in entry:  # another kernel's entry at a published speed ratio
        ref = entry["scaled_from"]
        base = kernel_efficiency(gen, ref["kernel"])
        if base is None or "scaled_from" in table[gen][ref["kernel"]]:
            raise MeshplanError(f"{KERNELS_FILE}: {gen}/{kernel} is scaled from {ref['kernel']}, "
                                f"which needs an entry of its own on {gen}")
        return replace(base, kernel=kernel, source=entry["source"],
                       attention_efficiency=base.attention_efficiency * float(ref["rate_ratio"]))
    curve = entry.get("curve", {})
    unknown = sorted(set(curve) - set(CURVE_FIELDS))
    if unknown:
        raise MeshplanError(f"{KERNELS_FILE}: {gen}/{kernel} curve sets {', '.join(unknown)}; "
                            f"a curve may set: {', '.join(CURVE_FIELDS)}")
    return KernelEfficiency(generation=gen, kernel=kernel, attention_efficiency=float(entry["attention_efficiency"]),
                            source=entry["source"], curve=tuple((f, float(curve[f])) for f in CURVE_FIELDS
                                                                if f in curve))


def kernel_fields(generation: str, kernel: str) -> dict[str, float]:
    """The Calibration fields of ``kernel`` on ``generation`` (efficiency and curve); empty where
    the table has no entry (the caller keeps its values)."""
    entry = kernel_efficiency(generation, kernel)
    return entry.fields() if entry is not None else {}


def kernels_with_figures() -> tuple[tuple[str, str], ...]:
    """(generation, kernel) of the entries that carry published figure points."""
    return tuple((gen, kernel) for gen, entries in _raw()["efficiency"].items()
                 for kernel, entry in entries.items() if "figure_points" in entry)


def figure_points(generation: str, kernel: str) -> Mapping[str, Any]:
    """The entry's hand-read figure: peak_tflops, seq_len, and TFLOP/s by pass ('forward',
    'backward'), mask ('causal', 'non_causal') and head dim, one value per seq_len (a shorter list
    covers the first lengths)."""
    check_kernel(kernel)
    entry = _raw()["efficiency"].get(generation, {}).get(kernel, {})
    if "figure_points" not in entry:
        raise MeshplanError(f"no published figure points for {kernel} on {generation}; "
                            f"with points: {', '.join(f'{g}/{k}' for g, k in kernels_with_figures())}")
    return entry["figure_points"]
