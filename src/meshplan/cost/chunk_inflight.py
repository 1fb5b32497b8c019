"""Interleaved 1F1B's activations in flight when a rank's virtual stages differ in size.

Under the interleaved schedule a rank runs ``v`` model chunks (virtual stages ``j * p + r``,
j = 0..v-1). Megatron-Core's order (megatron/core/pipeline_parallel/schedules.py,
``forward_backward_pipelining_with_interleaving``, ``get_model_chunk_id``) runs the forwards in
groups of ``p`` micro-batches per chunk, chunk 0 first (forward k is chunk (k // p) mod v), the
backwards in the same groups from the last chunk down (backward k is chunk v-1 - (k // p) mod v),
after ``W = 2 (p - r - 1) + (v - 1) p`` warm-up forwards (``microbatch_group_size_per_vp_stage``
= p, its default). The rank holds W + 1 chunk activation sets at its peak (Narayanan et al. 2021,
Sec. 2.2; :func:`meshplan.cost.pipeline.in_flight_chunks`), but not an even mix of its chunks:
chunk 0 is held ``p + 2 (p - r - 1) + 1`` times on the first rank, each later chunk ``p`` times.
When the chunks hold different layer counts (Megatron's embedding / loss accounting gives the first
virtual stage one layer fewer; the DeepSeek-V3 layouts), the held layers are

    max over steady-state steps i of  sum_{k <= W + i} L[fwd chunk k] - sum_{k < i} L[bwd chunk k]

and :func:`chunk_weight` is that over the even mix's ``(W + 1) * sum(L) / v``: the factor on the
rank's stored activations (1 when every chunk holds as many layers). Pure functions over one plan's
chunk sizes, called per rank from ``estimate`` and ``estimate_split_batch``.
"""

from __future__ import annotations

import numpy as np

from meshplan.plan import Plan, Schedule, even_split


def interleaved_warmup(rank: int, pp: int, vpp: int, group: int | None = None) -> int:
    """Megatron-Core's warm-up forwards on ``rank`` (schedules.py): ``(p - r - 1) * 2 +
    (v - 1) * group``, ``group`` the micro-batches per chunk group (default p)."""
    group = pp if group is None else group
    return (pp - rank - 1) * 2 + (vpp - 1) * group


def layer_weighted_in_flight(rank: int, pp: int, vpp: int, num_microbatches: int,
                             chunk_layers: tuple[int, ...]) -> float:
    """Most layer activation sets (one micro-batch through one layer each) ``rank`` holds at once,
    with ``chunk_layers[j]`` layers in its chunk j (module docstring)."""
    if len(chunk_layers) != vpp:
        raise ValueError(f"{len(chunk_layers)} chunk sizes for {vpp} virtual stages")
    total = num_microbatches * vpp
    k = np.arange(total)
    group = (k // pp) % vpp
    sizes = np.asarray(chunk_layers, dtype=float)
    fwd = np.cumsum(sizes[group])  # layers forwarded after forward k
    bwd = np.concatenate(([0.0], np.cumsum(sizes[vpp - 1 - group])))  # freed before backward i
    warm = min(interleaved_warmup(rank, pp, vpp), total - 1)
    steps = total - warm
    return float(np.max(fwd[warm:warm + steps] - bwd[:steps]))


def chunk_weight(rank: int, pp: int, vpp: int, num_microbatches: int, chunk_layers: tuple[int, ...]) -> float:
    """:func:`layer_weighted_in_flight` over the even mix of the same chunks (1.0 when they are
    equal, or with no layer on the rank)."""
    layers = sum(chunk_layers)
    if layers == 0:
        return 1.0
    held = min(interleaved_warmup(rank, pp, vpp) + 1, num_microbatches * vpp)
    return layer_weighted_in_flight(rank, pp, vpp, num_microbatches, chunk_layers) / (held * layers / vpp)


def plan_chunk_weight(plan: Plan, rank: int, num_microbatches: int) -> float:
    """:func:`chunk_weight` of ``rank`` under ``plan`` (with its defaults filled): 1.0 unless the
    plan runs the interleaved schedule over a layout of its own (Megatron's layouts, the embedding /
    loss split). The even split (``plan.even_split``, chunks within one layer of each other) is
    scored as ``estimate_batch`` and the search score it, an even mix, so that ``estimate`` and the
    search agree on every plan the search proposes."""
    if plan.schedule != Schedule.INTERLEAVED_1F1B or plan.vpp <= 1 or not plan.stage_layers:
        return 1.0
    return layout_chunk_weight(tuple(plan.stage_layers), plan.dims.pp, plan.vpp, rank, num_microbatches)


def layout_chunk_weight(stage_layers: tuple[int, ...], pp: int, vpp: int, rank: int,
                        num_microbatches: int) -> float:
    """:func:`chunk_weight` of ``rank`` under the interleaved schedule over virtual stages holding
    ``stage_layers`` (model order; virtual stage ``j * pp + rank`` is the rank's chunk j), 1.0 for
    the even split (:func:`plan_chunk_weight`). The one rule ``estimate`` and the search's exact
    re-scoring (``meshplan.search.split_scoring.score_splits``) both apply."""
    layers, stages = sum(stage_layers), len(stage_layers)
    if stages <= layers and stage_layers == even_split(layers, stages):
        return 1.0
    sizes = tuple(stage_layers[j * pp + rank] for j in range(vpp))
    return chunk_weight(rank, pp, vpp, num_microbatches, sizes)


def largest_chunk_layers(plan: Plan, rank: int) -> int:
    """Layers of the largest virtual stage on ``rank`` (its chunks ``j * pp + rank``) under
    ``plan`` with its defaults filled; the rank's layers when it runs one stage."""
    pp, vpp = plan.dims.pp, plan.vpp
    if vpp <= 1 or len(plan.stage_layers) != pp * vpp:
        return plan.layers_on_rank(rank)
    return max(plan.stage_layers[j * pp + rank] for j in range(vpp))
