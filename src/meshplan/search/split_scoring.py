"""Exact cost of concrete stage splits (per-rank layer and recomputed counts): what ``estimate``
gives for each, through ``rank_cost`` and ``compose``, and the virtual-stage layout the search
writes for a split (:func:`chunk_split`)."""

from __future__ import annotations

import numpy as np

from meshplan.cost.arrays import SCHEDULE_CODES, PlanArrays
from meshplan.cost.batch import StepPeak, compose_maxima, num_microbatches, rank_cost
from meshplan.cost.chunk_inflight import layout_chunk_weight
from meshplan.cost.layer import LayerCost, layer_cost
from meshplan.cost.rank_layers import StackLayers, lead_on_ranks
from meshplan.plan import Schedule, even_split
from meshplan.search.tables import CostContext, SharedLayerCost, _gather, _stack, rank_fit_bytes
from meshplan.spec.training import TrainingSpec


def score_splits(ctx: CostContext, plans: PlanArrays, layers: np.ndarray, recomputed: np.ndarray,
                 layer: LayerCost | None = None, stack: StackLayers | None = None,
                 shared: SharedLayerCost | None = None) -> StepPeak:
    """Exact cost of each plan (row) with per-rank layer and recomputed counts (P, pp): what
    ``compose`` gives for step time and peak memory (``stack``: each rank charged its kinds;
    ``shared``, the plans' rows of a :class:`SharedLayerCost`, stands for ``layer`` and ``stack``)."""
    P, pp = layers.shape
    if shared is not None:
        stack = shared.stack
    elif layer is None:
        layer = layer_cost(ctx.model, ctx.cluster, ctx.training, plans, ctx.calib)
    sp, idx = _stack(plans, pp)  # rank-major blocks: block j is rank j of every plan
    rank = np.repeat(np.arange(pp), P)
    rows_layer, rows_stack = _gather(layer, stack, shared, idx)
    mix = {} if stack is None else {"stack": rows_stack,
                                    "lead": lead_on_ranks(ctx.model, layers, plans.vpp).T.reshape(-1)}
    rc = rank_cost(ctx.model, ctx.cluster, ctx.training, sp, ctx.calib, rows_layer,
                   rank=rank, layers=layers.T.reshape(-1), recomputed=recomputed.T.reshape(-1),
                   has_embedding=rank == 0, has_head=rank == pp - 1, totals=False,
                   chunk_weight=_chunk_weights(ctx.training, plans, layers, recomputed).T.reshape(-1), **mix)

    def most(x):  # rank-major (pp * P,) -> the max over the ranks, (P,)
        return np.broadcast_to(x, (pp * P,)).reshape(pp, P).max(axis=0)

    return compose_maxima(ctx.training, plans, ctx.calib, microbatch_s=most(rc.microbatch_s),
                          step_extra_s=most(rc.step_extra_s), memory_bytes=most(rank_fit_bytes(rc, sp, ctx.calib)),
                          host_bytes=most(rc.host_bytes))


def _chunk_weights(training: TrainingSpec, plans: PlanArrays, layers: np.ndarray,
                   recomputed: np.ndarray) -> np.ndarray:
    """(P, pp) interleaved chunk weights of the plans the search writes (:func:`chunk_split` of
    each row), as ``estimate`` charges them (``cost.chunk_inflight.layout_chunk_weight``).

    That weight is 1 for an even layout (the virtual stages as ``plan.even_split`` makes them) and
    otherwise depends on the rank only through its own chunks, i.e. its layer count n and v, and
    on its index and the micro-batch count m: it is computed once per distinct (n, rank, v, m)
    of the uneven rows (from the first such row's layout), not once per row and rank."""
    P, pp = layers.shape
    weights = np.ones((P, pp))
    interleaved = (plans.schedule == SCHEDULE_CODES.index(Schedule.INTERLEAVED_1F1B)) & (plans.vpp > 1)
    rows = np.flatnonzero(interleaved)
    if rows.size == 0:
        return weights
    m = np.broadcast_to(np.asarray(num_microbatches(training, plans), dtype=np.int64), (P,))
    n = layers.astype(np.int64)
    for vpp in np.unique(plans.vpp[rows]):
        vpp = int(vpp)
        sub = rows[plans.vpp[rows] == vpp]
        stage = _stage_layers(n[sub], vpp)  # (R, vpp * pp), model order, as chunk_split
        total = stage.sum(axis=1)
        uneven = np.ones(sub.size, dtype=bool)
        for tot in np.unique(total):
            same = total == tot
            if pp * vpp <= tot:
                uneven[same] = np.any(stage[same] != np.asarray(even_split(int(tot), pp * vpp)), axis=1)
        sub, stage = sub[uneven], stage[uneven]
        if sub.size == 0:
            continue
        # one key per (row, rank): (n, rank, m) (v is this loop's)
        key_n, key_r = n[sub].reshape(-1), np.tile(np.arange(pp), sub.size)
        key_m = np.repeat(m[sub], pp)
        code = (key_m * (int(key_n.max()) + 1) + key_n) * pp + key_r  # mixed radix: 1-D unique is fast
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        values = np.array([layout_chunk_weight(tuple(int(x) for x in stage[j // pp]), pp, vpp, int(key_r[j]),
                                               int(key_m[j])) for j in first])
        weights[sub] = values[inverse.reshape(-1)].reshape(sub.size, pp)
    return weights


def _stage_layers(rank_layers: np.ndarray, vpp: int) -> np.ndarray:
    """:func:`chunk_split`'s virtual-stage layer counts of many rows at once: (R, pp) per-rank
    totals -> (R, vpp * pp), virtual stage ``ch * pp + rank`` (the remainder on the last chunks)."""
    base, extra = np.divmod(rank_layers, vpp)  # (R, pp)
    ch = np.arange(vpp)[None, :, None]  # (1, vpp, 1)
    stage = base[:, None, :] + (ch >= vpp - extra[:, None, :])  # (R, vpp, pp)
    return stage.reshape(rank_layers.shape[0], -1)


def chunk_split(rank_layers: np.ndarray, rank_recomputed: np.ndarray, vpp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per virtual stage (model order) layer and recomputed counts from per-rank totals.

    Virtual stage i lives on rank i % pp; a rank's layers are spread evenly over its chunks (the
    time of a rank is that of its totals), the remainder on its LAST chunks: under the interleaved
    schedule chunk 0 is held most often (``meshplan.cost.chunk_inflight``), so this order holds the
    fewest activations. Its recomputed layers are filled chunk by chunk from chunk 0.
    """
    pp = len(rank_layers)
    stage_layers = [0] * (pp * vpp)
    stage_rec = [0] * (pp * vpp)
    for rnk in range(pp):
        n, r = int(rank_layers[rnk]), int(rank_recomputed[rnk])
        base, extra = divmod(n, vpp)
        for ch in range(vpp):
            k = base + (1 if ch >= vpp - extra else 0)
            take = min(k, r)
            stage_layers[ch * pp + rnk] = k
            stage_rec[ch * pp + rnk] = take
            r -= take
    return tuple(stage_layers), tuple(stage_rec)
