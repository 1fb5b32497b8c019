"""Which fields a (GPU generation, stack) pair sets over the Calibration defaults, and the source
line that says where they came from: a pure function of the calibration data
(:mod:`meshplan.cost.calib_records`), applied by ``calibration.calibration_for``.

Order, later wins: where the pair has no record of its own, the hardware fields of a record
borrowed from another stack of the same generation, or, where the generation has no such lender,
the GEMM fields carried from a record of another generation (cost/generation_transfer.py); then,
always, the attention efficiency of the stack's kernel on this generation with its published rate
curve where the table has one (cost/attention_kernels.py); then the stack's mechanisms; then the
pair's own record. The kernel table is where a fit of the pair starts (calib/fit.py ``fit_start``)
and a record keeps only what the fit moved from its start, so a record without
``attention_efficiency`` means the table's value, and one with it overrides the table. Before
session 10 a pair with a record skipped the table, so Megatron on Blackwell ran the A100 default
0.55 instead of cuDNN's 0.44 on Blackwell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshplan.cost.attention_kernels import KernelEfficiency, kernel_efficiency
from meshplan.cost.calib_records import FittedRecord, StackRecord, record_key
from meshplan.cost.generation_transfer import Transfer, carried_fields
from meshplan.errors import MeshplanError


@dataclass(frozen=True)
class ResolvedCalibration:
    values: Mapping[str, Any]
    """Calibration fields over the defaults."""
    source: str


def kernel_source(kernel: str, entry: KernelEfficiency, own: FittedRecord | None) -> str:
    """The source line of the attention efficiency: the table's, or the record's over it."""
    curve = " and its published curve" if entry.curve else ""
    table = f"attention_efficiency {entry.attention_efficiency:g}{curve} of {kernel} on {entry.generation} " \
            "(attention kernel table)"
    if own is not None and "attention_efficiency" in own.values:
        return f"attention_efficiency {own.values['attention_efficiency']:g} fitted ({own.key}) over the table's: {table}"
    return table


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
        sources.append(kernel_source(kernel, entry, own))
    values.update(stacks[stack].values)
    sources.append(f"{stack} stack mechanisms")
    if own is not None:
        values.update(own.values)
        sources.insert(0, own.source)
    source = "; ".join(sources) if own is not None or len(sources) > 1 else f"defaults; {stack} stack mechanisms"
    return ResolvedCalibration(values=values, source=source)
