"""The knobs in which two plans of one job differ, named as `meshplan validate` reports the error of
a ratio between two measured layouts (calib/pairwise.py) and as the robust recommendation reads it
(search/robust.py). Here, below both, so the search does not import the calibration package."""

from __future__ import annotations

from typing import Any, Callable

from meshplan.plan import Plan, Recompute

MIN_PAIRS = 3
"""A knob measured by fewer pairs than this has no pairwise error of its own (the robust
recommendation falls back to the absolute error)."""


def _stage_split(p: Plan) -> tuple | None:
    """The layer split: None without a pipeline or when even (an empty split is the even one)."""
    if p.dims.pp * p.vpp == 1 or len(set(p.stage_layers)) <= 1:
        return None
    return p.stage_layers


def _recompute(p: Plan) -> tuple | None:
    if p.recompute == Recompute.NONE:
        return None
    layers = None if tuple(p.recompute_layers) in ((), tuple(p.stage_layers)) else p.recompute_layers
    return (p.recompute, layers, p.recompute_modules)


KNOBS: tuple[tuple[str, Callable[[Plan], Any]], ...] = (
    ("mb", lambda p: p.micro_batch),
    ("tp", lambda p: (p.dims.tp, p.sp and p.dims.tp > 1)),  # sequence parallel is a mode of TP
    ("pp", lambda p: p.dims.pp),
    ("schedule", lambda p: (p.schedule, p.vpp) if p.dims.pp > 1 else None),
    ("layers", _stage_split),
    ("cp", lambda p: (p.dims.cp, p.cp_method if p.dims.cp > 1 else None)),
    ("ep", lambda p: p.dims.ep),
    ("etp", lambda p: p.dims.etp if p.dims.ep > 1 and p.dims.etp not in (0, p.dims.tp) else None),
    ("zero", lambda p: p.zero if p.dims.dp_shard * p.dims.cp > 1 else 0),
    ("hsdp", lambda p: p.dims.dp_replicate > 1 and p.dims.dp_shard > 1),
    ("recompute", _recompute),
    ("offload", lambda p: (p.offload, p.offload_layers) if p.offload else None),
)
"""The plan knobs a pair of layouts can differ in (the data-parallel degree is not one: at a fixed
GPU count it follows from the others)."""


def knobs_differing(a: Plan, b: Plan) -> tuple[str, ...]:
    """The ``KNOBS`` in which ``a`` and ``b`` differ ('layers', an uneven split, only when the
    pipeline shapes agree)."""
    out = tuple(name for name, of in KNOBS if of(a) != of(b))
    if "pp" in out or "schedule" in out:
        out = tuple(k for k in out if k != "layers")
    return out


KNOB_SET_SEP = "+"
"""Joins the knobs of a knob set in ``summarize``'s 'by_knob_set' keys ("mb+tp")."""
