"""Checks of the numbers a spec takes, where they enter (constructors, CLI flags): a count is a
positive integer no larger than MAX_COUNT, a rate or a size is a finite number.

One place, so that a file, a flag and a preset are held to the same rule, and a value that would
overflow the cost model's arrays (``--seq-len 99999999999999999999``) or poison it (``nan``,
``inf``) is refused with one line naming it.
"""

from __future__ import annotations

import math

from meshplan.errors import MeshplanError

MAX_COUNT = 2**31 - 1
"""Largest count a spec takes (layers, widths, heads, tokens, sequences, GPUs, parallel degrees):
the largest C ``int``, the type of world sizes and ranks in NCCL and torch.distributed and of the
sizes in Megatron-LM's arguments. The cost model holds counts in int64/float64 NumPy arrays, where
a product of a few such counts stays exact enough and far from overflow."""


def check_count(name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` as a count: an int (not a bool) in [minimum, MAX_COUNT]; else one MeshplanError."""
    if not isinstance(value, int) or isinstance(value, bool):
        kind = "positive" if minimum >= 1 else "non-negative"
        raise MeshplanError(f"{name} must be a {kind} integer, got {value!r}")
    if value < minimum:
        kind = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
        raise MeshplanError(f"{name} must be a {kind} integer, got {value!r}")
    if value > MAX_COUNT:
        raise MeshplanError(f"{name} = {value} is too large (at most {MAX_COUNT:,})")
    return value


def check_finite(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a finite real number, >= 0 (or > 0 with ``positive``); else one MeshplanError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise MeshplanError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise MeshplanError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise MeshplanError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)
