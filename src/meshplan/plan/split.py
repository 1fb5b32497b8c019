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


def torchtitan_split_2024(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """torchtitan's default split when no ``pipeline_parallel_split_points`` are given, from
    pytorch/torchtitan #604 (2024-10) until #1416 (2025-07): ``generate_split_points``
    (torchtitan/parallelisms/pipelining_utils.py, the version the 2024-12 rows ran, 9dec370):
    the first stage takes ``num_layers // num_stages``, each middle stage one more while the
    remainder lasts, the last stage what is left. 126 layers over 8 stages: 15, 16 x 6, 15."""
    if num_stages < 1 or num_stages > num_layers:
        raise MeshplanError(f"torchtitan cannot split {num_layers} layers into {num_stages} stages "
                            "(total stages cannot be greater than the number of layers)")
    if num_stages == 1:
        return (num_layers,)
    base, extra = divmod(num_layers, num_stages)
    counts = [base]
    for _ in range(num_stages - 2):
        counts.append(base + (1 if extra > 0 else 0))
        extra -= 1 if extra > 0 else 0
    return (*counts, num_layers - sum(counts))


def torchtitan_split(num_layers: int, num_stages: int, input_weight: int = 1,
                     output_weight: int = 1) -> tuple[int, ...]:
    """torchtitan's default split since pytorch/torchtitan #1416 (2025-07):
    ``generate_llm_fqn_per_model_part`` (torchtitan/distributed/pipeline_parallel.py@02ef790):
    the embedding counts as ``input_weight`` layers and the norm + output as ``output_weight``
    (``pipeline_parallel_first/last_stage_less_layers``, 1 each by default), the
    ``num_layers + weights`` slots split evenly with the earlier stages taking the remainder.
    32 layers over 4 stages: 8, 9, 8, 7."""
    if num_stages < 1:
        raise MeshplanError("torchtitan needs at least one pipeline stage")
    if num_stages == 1:
        return (num_layers,)
    slots = num_layers + input_weight + output_weight
    per, extra = divmod(slots, num_stages)
    if per == 0 or input_weight > per or output_weight > per:
        raise MeshplanError(f"torchtitan cannot split {num_layers} layers (+ {input_weight} for the embedding, "
                            f"+ {output_weight} for the output) into {num_stages} stages")
    counts, left = [], num_layers
    for i in range(num_stages):
        want = per + (1 if i < extra else 0)
        want -= input_weight if i == 0 else (output_weight if i == num_stages - 1 else 0)
        take = min(max(want, 0), left)
        counts.append(take)
        left -= take
    return tuple(counts)
