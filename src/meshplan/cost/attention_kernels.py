"""The attention core's efficiency per (GPU generation, fused attention kernel), as data.

A training stack names the kernel it runs (``Calibration.attention_kernel``, a stack field); the
table (``KERNELS_FILE``, each entry with its source: FlashAttention-2 on A100, Dao 2023 Sec. 4.1;
FlashAttention-2 vs -3 and cuDNN on H100, Shah et al. 2024; FlashAttention-4 vs cuDNN on B200)
gives the starting ``attention_efficiency`` of a (generation, stack) that has no fitted record
(``cost.calibration.calibration_for``). Issue 14, item 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json

KERNELS_FILE = "presets/attention_kernels.json"
"""The kernels and their efficiency per generation, with sources (under meshplan.spec)."""


@dataclass(frozen=True, kw_only=True)
class KernelEfficiency:
    """One table entry: the attention core's efficiency of ``kernel`` on ``generation``."""

    generation: str
    """The generation whose entry this is (a borrowing generation's lender)."""
    kernel: str
    attention_efficiency: float
    source: str


@lru_cache(maxsize=1)
def _raw() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", KERNELS_FILE)


def kernel_names() -> tuple[str, ...]:
    """The attention kernels a stack may name ('fa2', 'fa3', 'fa4', 'cudnn')."""
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
    return KernelEfficiency(generation=gen, kernel=kernel, attention_efficiency=float(entry["attention_efficiency"]),
                            source=entry["source"])
