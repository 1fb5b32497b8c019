"""The embedding / loss layout: interleaved plans of ``num_layers + 2`` virtual stages, the
embedding and the loss each a stage of its own (Megatron-Core's
``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``; the Llama 3.1
405B Megatron-Bridge recipe runs 126 layers as pp16 x vpp8 = 128 chunks). Such a configuration
has one layer split (``plan.embedding_loss_split``: ``E|t|t|...|t|L``), so it is scored here once,
exactly, rather than by the even pass and the stage search, whose per-rank tables assume at least
one layer per chunk (:mod:`meshplan.search.stages`).

Per pipeline rank (virtual stage s on rank s % p, v chunks each): rank 0 holds the embedding and
v - 1 layers, the last rank v - 1 layers and the loss, every other rank v layers. The ranks in
between hold the same layers and neither end, and the earliest of them (rank 1) holds the most
micro-batches in flight (``cost.pipeline.in_flight_chunks`` falls with the rank) and, where a
stack preallocates receive buffers, the most of those (``cost.batch.middle_rank``): ranks 0, 1
and p - 1 bound the step's slowest rank and its most loaded one. Their interleaved chunk weights
are the layout's (``cost.chunk_inflight.layout_chunk_weight``), as ``estimate`` charges the plan.
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import StepPeak, num_microbatches, plan_terms, rank_cost
from meshplan.cost.chunk_inflight import layout_chunk_weight
from meshplan.cost.rank_layers import needs_rank_mix
from meshplan.plan import embedding_loss_split
from meshplan.search.frontier import Front, dominated_by
from meshplan.search.prune import STRICT
from meshplan.search.space import SearchOptions, embedding_loss_space
from meshplan.search.tables import CostContext, fit_step_peak, shared_layer_cost

SCORE_ROWS = 1 << 16
"""Configurations scored at once (as ``search.even.EVEN_CHUNK_ROWS``: temporaries stay in cache)."""


def embedding_loss_layers(num_layers: int, pp: int, vpp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(layers per virtual stage in model order, layers per pipeline rank) of the layout."""
    stages = embedding_loss_split(num_layers, pp * vpp)
    return stages, tuple(sum(stages[r::pp]) for r in range(pp))


def _chunk_weights(ctx: CostContext, plans: PlanArrays, rank: np.ndarray) -> np.ndarray:
    """``layout_chunk_weight`` of each row's rank ``rank`` under its layout, once per distinct
    (pp, vpp, micro-batches, rank)."""
    m = np.broadcast_to(np.asarray(num_microbatches(ctx.training, plans), dtype=np.int64), (len(plans),))
    r = np.broadcast_to(np.asarray(rank, dtype=np.int64), (len(plans),))
    pp = plans.pp.astype(np.int64)
    # vpp follows from pp (L + 2 chunks): (pp, micro-batches, rank) in one mixed-radix code (1-D unique is fast)
    code = (pp * (int(m.max(initial=0)) + 1) + m) * (int(pp.max(initial=0)) + 1) + r
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    L = ctx.model.num_layers
    values = np.array([layout_chunk_weight(embedding_loss_split(L, int(pp[j]) * int(plans.vpp[j])), int(pp[j]),
                                           int(plans.vpp[j]), int(r[j]), int(m[j])) for j in first])
    return values[np.asarray(inverse).reshape(-1)]


def score_embedding_loss(ctx: CostContext, plans: PlanArrays, bound_only: bool = False) -> StepPeak:
    """Step time and the device peak "fits" reads of every row under its embedding / loss layout
    (every layer under the row's recompute policy), from ranks 0, 1 and p - 1 (module docstring).
    ``bound_only``: from rank 1 alone (rank 0 with one rank), below both (``compose`` takes the
    ranks' largest micro-batch time, tail and memory and grows with each)."""
    layer = shared_layer_cost(ctx, plans, with_stack=False).take(slice(None))
    kw = dict(model=ctx.model, cluster=ctx.cluster, training=ctx.training, plans=plans, calib=ctx.calib, layer=layer)
    kw["terms"] = plan_terms(**kw)
    last = plans.pp - 1
    ranks = []
    for rank in ((np.minimum(1, last),) if bound_only else (np.zeros_like(last), np.minimum(1, last), last)):
        layers = plans.vpp - (rank == 0) - (rank == last)
        ranks.append(rank_cost(**kw, rank=rank, layers=layers, recomputed=layers, has_embedding=rank == 0,
                               has_head=rank == last, totals=False, chunk_weight=_chunk_weights(ctx, plans, rank)))
    return fit_step_peak(ctx, plans, ranks)


def embedding_loss_front(ctx: CostContext, groups: dict[str, np.ndarray], options: SearchOptions,
                         key_base: int, known: Front | None = None) -> tuple[PlanArrays | None, Front, int]:
    """The embedding / loss configurations of ``groups`` (``space.embedding_loss_space``), scored:
    (the configurations, their front keyed from ``key_base`` on, how many were scored).

    ``known`` (exact plans the search has scored): a configuration whose bound (rank 1 alone,
    ``score_embedding_loss``'s ``bound_only``) a known plan beats strictly in both objectives
    (``prune.STRICT``) is never on the search's frontier, and is left out of this front unscored.

    Not for a model whose ranks are charged their own kinds of layers (leading dense layers, MTP
    modules: ``cost.rank_layers.needs_rank_mix``): which rank holds those under this layout is
    not what the search's rank tables place (a bound of the space, stated in docs/search.md)."""
    if not options.embedding_loss_chunks or needs_rank_mix(ctx.model):
        return None, Front.empty(), 0
    space = embedding_loss_space(groups, ctx.model, ctx.training, options)
    if space is None:
        return None, Front.empty(), 0
    rows = np.arange(len(space))
    if known is not None and len(known):
        lb_t, lb_m = _scored(ctx, space, rows, bound_only=True)
        rows = rows[~dominated_by(known.time_s, known.memory_bytes, lb_t * STRICT, lb_m * STRICT)]
    t, m = _scored(ctx, space, rows)
    return space, Front.of(t, m, key_base + rows), len(space)


def _scored(ctx: CostContext, space: PlanArrays, rows: np.ndarray,
            bound_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(step, peak) of ``space``'s ``rows`` (:func:`score_embedding_loss`), SCORE_ROWS at a time."""
    t, m = np.empty(rows.size), np.empty(rows.size)
    for i in range(0, rows.size, SCORE_ROWS):
        part = slice(i, i + SCORE_ROWS)
        est = score_embedding_loss(ctx, space.take(rows[part]), bound_only=bound_only)
        t[part], m[part] = est.step_time_s, est.peak_memory_bytes
    return t, m


def embedding_loss_plan(ctx: CostContext, space: PlanArrays, row: int):
    """The plan of ``space``'s row ``row`` with its layout's split and every layer recomputed
    under its policy (``Plan.with_defaults`` writes no recompute as such)."""
    stages, _ = embedding_loss_layers(ctx.model.num_layers, int(space.pp[row]), int(space.vpp[row]))
    return space.plan(row, stage_layers=stages, recompute_layers=stages)
