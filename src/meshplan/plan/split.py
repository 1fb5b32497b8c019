"""Layer splits over pipeline stages and their compact notation (``2x3,1,3``)."""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count


def format_counts(counts: tuple[int, ...]) -> str:
    """``(2, 2, 2, 1, 3)`` -> ``2x3,1,3``: comma separated, a run of K equal values N as ``NxK``."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def parse_counts(text: str, what: str, *, max_entries: int | None = None) -> tuple[int, ...]:
    """The inverse of :func:`format_counts`: ``2x3,1,3`` -> ``(2, 2, 2, 1, 3)``. ``max_entries``
    (the plan's pp*vpp stages, where the caller knows it): a list naming more is refused before it
    is built (``1x99999999999999999999`` would not fit in memory)."""
    items: list[tuple[int, int]] = []
    for item in text.split(","):
        value, times, repeat = item.strip().partition("x")
        try:
            n, k = int(value), int(repeat) if times else 1
        except ValueError:
            raise MeshplanError(f"{what} {text!r}: give counts like 9,10x6,11 (N, or N repeated K times as NxK)") from None
        if n < 0 or k < 1:
            raise MeshplanError(f"{what} {text!r}: counts must be >= 0 and repeats >= 1")
        check_count(f"{what} count", n, minimum=0)
        check_count(f"{what} repeat", k)
        items.append((n, k))
    total = sum(k for _, k in items)
    if max_entries is not None and total > max_entries:
        raise MeshplanError(f"{what} {text!r} has {total} entries; pp*vpp={max_entries} stages")
    return tuple(n for n, k in items for _ in range(k))


def even_split(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Split layers as evenly as possible; the earlier stages take the remainder."""
    if num_stages < 1 or num_stages > num_layers:
        raise MeshplanError(f"cannot split {num_layers} layers into {num_stages} stages")
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if i < extra else 0) for i in range(num_stages))


def embedding_loss_split(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Megatron-Core's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``: the embedding and the loss count as one layer each,
    the ``num_layers + 2`` slots split evenly (Megatron requires it to divide), so the first and
    last stages hold one transformer layer fewer (none when every stage holds one slot)."""
    slots = num_layers + 2
    if num_stages < 2 or slots % num_stages:
        raise MeshplanError(f"{num_layers} layers + embedding + loss = {slots} slots do not split evenly "
                            f"into {num_stages} stages")
    per = slots // num_stages
    return (per - 1,) + (per,) * (num_stages - 2) + (per - 1,)
