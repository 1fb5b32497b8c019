"""Bridge from the cost model to the stage search: affine per-rank tables and exact re-scoring
(:mod:`meshplan.search.split_scoring`).

The stage search (:mod:`meshplan.search.stages`) needs, for each global configuration, the cost
of one pipeline rank as an affine function of its layer count n and recomputed count r. This
module reads those coefficients off the cost model itself by finite differences of
``meshplan.cost.batch.rank_cost`` (no formula is repeated here), and scores any concrete
(n, r) per rank exactly with ``rank_cost`` + ``compose``, the functions ``estimate`` uses.

Step time is ``alpha * max_s t_s + max_s x_s`` (``pipeline_time`` is linear in the slowest
rank's micro-batch time t; x is the per-step data-parallel and optimizer tail). The table folds
x into a per-micro-batch time ``t_s + x_s / alpha`` (exact when one rank is slowest in both) and
keeps the tails apart too, so that the walk ranks splits by the step itself
(:mod:`meshplan.search.stage_tails`); every reported point is re-scored exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import StepPeak, compose_maxima, num_microbatches, rank_cost
from meshplan.cost.calibration import Calibration
from meshplan.cost.device_memory import fit_bytes
from meshplan.cost.layer import LayerCost, layer_cost
from meshplan.cost.rank_layers import StackLayers, needs_rank_mix, stack_layers
from meshplan.cost.pipeline import in_flight_chunks, pipeline_time
from meshplan.search.space import RECOMPUTES
from meshplan.search.stages import StageTable
from meshplan.plan import Recompute
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class CostContext:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    calib: Calibration


_LAYER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LayerCost))


def _take_layer(layer: LayerCost, idx: np.ndarray) -> LayerCost:
    return LayerCost(**{name: _take_column(getattr(layer, name), idx) for name in _LAYER_FIELDS})


def _take_column(values, idx):
    """``values[idx]``; a column that is one value repeated (a broadcast view, stride 0: a cost
    term the same for every row) stays a broadcast view of the result's length, not a copy (the
    same values, read-only, as every cost column the search passes on)."""
    x = np.asarray(values)
    if x.ndim == 1 and x.size and x.strides[0] == 0 and isinstance(idx, np.ndarray) and idx.dtype != bool:
        return np.broadcast_to(x[:1].reshape(()), idx.shape)
    return x[idx]


def _take_stack(stack: StackLayers, idx: np.ndarray) -> StackLayers:
    """``stack.take(idx)`` with :func:`_take_column`'s broadcast columns."""
    pick = lambda c: None if c is None else _take_layer(c, idx)  # noqa: E731
    return StackLayers(lead_layers=stack.lead_layers, lead=pick(stack.lead), rest=pick(stack.rest), mtp=pick(stack.mtp))


def _stack(plans: PlanArrays, times: int) -> tuple[PlanArrays, np.ndarray]:
    idx = np.tile(np.arange(len(plans)), times)
    return plans.take(idx), idx


LAYER_KEY_FIELDS = ("tp", "cp", "ep", "etp", "sp", "micro_batch", "cp_method", "dp_shard", "zero",
                    "expert_balanced", "expert_replicas", "recompute_modules")
"""The plan fields ``layer_cost`` reads (tests/planner/test_search_tables.py checks that rows
equal on these get equal layer costs, so a change in the cost model cannot go unnoticed)."""


@dataclass(frozen=True)
class SharedLayerCost:
    """``layer_cost`` of the distinct LAYER_KEY_FIELDS rows (``unique``) and, per plan, the row
    that holds its cost (``row``). Plans' layer costs are gathered only for the slice in use, so
    that millions of configurations never materialise ~20 full-length columns at once."""

    unique: LayerCost
    row: np.ndarray
    stack: StackLayers | None = None
    """The same rows' costs of the kinds a rank is charged for (cost/rank_layers.py), for a model
    whose leading dense layers or MTP modules cluster on one rank; None otherwise."""

    def take(self, idx) -> LayerCost:
        """Layer costs of the plans at ``idx`` (an index array, a mask or a slice)."""
        return _take_layer(self.unique, self.row[idx])

    def take_stack(self, idx) -> StackLayers | None:
        return None if self.stack is None else _take_stack(self.stack, self.row[idx])

    def rows(self, idx) -> SharedLayerCost:
        """The same costs for the plans at ``idx`` (no column is gathered until ``take``)."""
        return SharedLayerCost(unique=self.unique, row=self.row[idx], stack=self.stack)


def _gather(layer: LayerCost | None, stack: StackLayers | None, shared: SharedLayerCost | None,
            idx: np.ndarray) -> tuple[LayerCost, StackLayers | None]:
    """Layer costs (and per-kind costs) of rows ``idx``: from ``shared``'s distinct rows when the
    caller has them (one gather from a small table), else from the full-length ``layer``."""
    if shared is not None:
        return shared.take(idx), shared.take_stack(idx)
    return _take_layer(layer, idx), None if stack is None else stack.take(idx)


def shared_layer_cost(ctx: CostContext, plans: PlanArrays, with_stack: bool = True) -> SharedLayerCost:
    """``layer_cost`` for every plan, computed once per distinct LAYER_KEY_FIELDS row.

    Many global configurations differ only in pipeline, schedule, replication or recompute
    policy, which one layer's cost does not depend on; this evaluates ~40x fewer rows.
    ``with_stack`` False leaves out the per-kind costs (``stack`` None) for a caller that reads
    the average layer only (the group bounds: about half the work on DeepSeek-V3).
    """
    key = np.zeros(len(plans), dtype=np.int64)
    for f in LAYER_KEY_FIELDS:  # mixed-radix code of the key columns (1-D unique is fast)
        col = getattr(plans, f)
        if col.size == 0 or col.min() == col.max():
            continue  # the same on every row: it splits no rows (the groups, and their order, stay)
        np.multiply(key, int(col.max()) + 1, out=key)
        np.add(key, col, out=key)
    # Rows that differ only in what the key leaves out (e.g. the recompute policy) are adjacent
    # in the enumerated space: sort only the first row of each run of equal keys.
    head = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1]))) if key.size else key
    _, first, run_inverse = np.unique(key[head], return_index=True, return_inverse=True)
    first = head[first]
    inverse = np.repeat(run_inverse.reshape(-1), np.diff(np.append(head, key.size)))
    unique = layer_cost_in_slices(ctx, plans.take(first))
    stack = None
    if with_stack and needs_rank_mix(ctx.model):
        stack = stack_layers(ctx.model, ctx.cluster, ctx.training, plans.take(first), ctx.calib)
        full = lambda c: None if c is None else LayerCost(**{  # noqa: E731
            f.name: np.broadcast_to(np.asarray(getattr(c, f.name), dtype=float), (first.size,))
            for f in fields(LayerCost)})
        stack = StackLayers(lead_layers=stack.lead_layers, lead=full(stack.lead), rest=full(stack.rest),
                            mtp=full(stack.mtp))
    return SharedLayerCost(unique=unique, row=inverse.reshape(-1), stack=stack)


LAYER_CHUNK_ROWS = 1 << 16
"""Rows :func:`shared_layer_cost` passes to ``layer_cost`` at once: its temporaries then stay in
the CPU caches (DeepSeek-V3 on 1024 GB200: the group bounds' 1.77M distinct rows in one call were
a third of the search). ``layer_cost`` is row-wise: the same values
(tests/planner/test_search_tables.py)."""


def layer_cost_in_slices(ctx: CostContext, plans: PlanArrays, module_codes: np.ndarray | None = None) -> LayerCost:
    """``layer_cost`` of ``plans``, every field a (len(plans),) float column ((len(plans), C) for
    the selective fields under ``module_codes``: ``layer_cost``'s), computed in slices of
    LAYER_CHUNK_ROWS rows; a field that is one value in every slice stays a broadcast of it."""
    n = len(plans)
    parts = [layer_cost(ctx.model, ctx.cluster, ctx.training, plans.take(np.arange(lo, min(n, lo + LAYER_CHUNK_ROWS))),
                        ctx.calib, module_codes=module_codes) for lo in range(0, n, LAYER_CHUNK_ROWS)] or [
        layer_cost(ctx.model, ctx.cluster, ctx.training, plans, ctx.calib, module_codes=module_codes)]
    out = {}
    for f in fields(LayerCost):
        values = [np.asarray(getattr(part, f.name), dtype=float) for part in parts]
        if all(v.ndim == 0 for v in values) and len({float(v) for v in values}) == 1:
            out[f.name] = np.broadcast_to(values[0], (n,))
        else:
            sizes = [min(LAYER_CHUNK_ROWS, n - lo) for lo in range(0, n, LAYER_CHUNK_ROWS)] or [0]
            out[f.name] = np.concatenate([np.broadcast_to(v, (k,) + v.shape[1:]) for v, k in zip(values, sizes)])
    return LayerCost(**out)


def pipeline_alpha(ctx: CostContext, plans: PlanArrays) -> np.ndarray:
    """Step seconds per second of slowest-rank micro-batch time (micro-batches + bubble)."""
    m = num_microbatches(ctx.training, plans)
    return pipeline_time(1.0, m, plans.pp, plans.vpp, plans.schedule, ctx.calib)[0] * np.ones(len(plans))


MEMORY_PROBE_LAYERS = 2
"""Fewest layers a stage-table memory probe holds (time is probed at 1 and 2 layers, as before). A rank's memory is affine in its layer count n except
for ZeRO-3's gathered layers, min(2, n) of them (cost/memory.py rank_other: the current layer and
the prefetched next, Zhao et al. 2023 Sec. 3.2): a slope read between 1 and 2 layers counts one
gathered layer per layer, and the table overstated a 61-layer pp=1 rank by 59 gathered layers
(~8 GiB on DeepSeek-V3 / 256 GB200, so the search pruned frontier points). Probing memory at n >= 2
puts every memory probe past that kink: for n >= 2 the gathered term is the constant 2 layers (or n,
when the stage stays unsharded: linear either way), so the table is exact for every rank of
n >= 2 layers, which is every pp=1 rank. A rank of one layer (pp near L) is overstated by one
gathered layer, the only place the table is not exact in memory."""


@dataclass(frozen=True)
class StageProbes:
    """``rank_cost`` of plans at the eight probes :func:`stage_table` reads its coefficients off,
    each (8, C): per-micro-batch time, per-step tail (at n0 = 1; NaN in the rows
    ``_PROBES_TIME_UNREAD``, which it does not read) and memory (at n0 = :data:`MEMORY_PROBE_LAYERS`)."""

    time_s: np.ndarray
    extra_s: np.ndarray
    memory_bytes: np.ndarray
    lead: int = 0
    """Leading dense layers (cost/rank_layers.py) the rank-0 probes hold besides their one layer:
    the first rank's intercept carries their difference from the other layers."""

    def take(self, idx) -> StageProbes:
        return StageProbes(self.time_s[:, idx], self.extra_s[:, idx], self.memory_bytes[:, idx], self.lead)


PROBE_CHUNK_PLANS = 1 << 12
"""Plans whose probes :func:`stage_probes` costs in one ``rank_cost`` call (at most 12 rows each:
~49k rows, about ``even.EVEN_CHUNK_ROWS``, whose temporaries stay in the CPU caches). One call
over every refinement candidate (Qwen3-30B-A3B on 256 GB200: 314k plans, 3.8M rows) made each
of its hundreds of passes stream ~30 MB arrays through memory. rank_cost is row-wise: the same
values (tests/planner/test_search_tables.py: each probe against rank_cost)."""


def stage_probes(ctx: CostContext, plans: PlanArrays, layer: LayerCost | None = None,
                 stack: StackLayers | None = None, shared: SharedLayerCost | None = None) -> StageProbes:
    """The probes of :func:`stage_table` for plans of any pipeline degrees, in stacked
    ``rank_cost`` calls of PROBE_CHUNK_PLANS plans (a caller tabling many groups pays their
    fixed cost once); each plan's columns are what ``stage_table`` computes for it alone. With
    ``stack`` the slopes are the non-leading layers', and the embedding rank's probe holds the
    leading dense layers too. ``shared`` (the plans' rows of a :class:`SharedLayerCost`) stands
    for ``layer`` and ``stack``."""
    if shared is None and layer is None:
        layer = layer_cost(ctx.model, ctx.cluster, ctx.training, plans, ctx.calib)
    C = len(plans)
    if C <= PROBE_CHUNK_PLANS:
        return _stage_probes(ctx, plans, layer, stack, shared)
    parts = []
    for lo in range(0, C, PROBE_CHUNK_PLANS):
        idx = np.arange(lo, min(C, lo + PROBE_CHUNK_PLANS))
        parts.append(_stage_probes(ctx, plans.take(idx), None if shared is not None else _take_layer(layer, idx),
                                   None if stack is None or shared is not None else _take_stack(stack, idx),
                                   None if shared is None else shared.rows(idx)))
    return StageProbes(*(np.concatenate([getattr(p, f) for p in parts], axis=1)
                         for f in ("time_s", "extra_s", "memory_bytes")), lead=parts[0].lead)


def _stage_probes(ctx: CostContext, plans: PlanArrays, layer: LayerCost | None,
                  stack: StackLayers | None, shared: SharedLayerCost | None) -> StageProbes:
    """:func:`stage_probes` in one stacked call (``layer`` or ``shared`` given)."""
    C = len(plans)
    if shared is not None:
        stack = shared.stack
    last, one = plans.pp - 1, plans.pp == 1
    d = stack.lead_layers if stack is not None else 0
    # Eight probes at n0 and n0 + 1 layers, (rank, n, r, embedding, head, lead), for time at
    # n0 = 1 and for memory at n0 = MEMORY_PROBE_LAYERS (see there): 16 in one stacked call.
    probes = [pr for n0 in (1, MEMORY_PROBE_LAYERS) for pr in (
              (0, n0, 0, False, False, 0), (0, n0 + 1, 0, False, False, 0), (0, n0 + 1, 1, False, False, 0),
              (0, n0 + 1, 2, False, False, 0), (last, n0, 0, False, False, 0), (last, n0 + 1, 0, False, False, 0),
              (0, n0 + d, 0, True, one, d), (last, np.where(one, n0 + d, n0), 0, one, True, np.where(one, d, 0)))]
    # Of the 16 probes, stage_table reads neither the time of 3, 4 and 5 (they are there for the
    # memory set) nor anything twice: time probe 1 is memory probe 0 (n0 + 1 = MEMORY_PROBE_LAYERS),
    # and with pp = 1 the last rank is rank 0 (probes 4, 5 and 7 repeat 0, 1 and 6). rank_cost
    # is row-wise, so each distinct (plan, probe) row is costed once and copied to its repeats:
    # 12 rows per plan with pp > 1, 8 with pp = 1, instead of 16 (the same values).
    K = len(probes)
    cols = [[np.broadcast_to(np.asarray(pr[j]), (C,)) for j in range(6)] for pr in probes]
    read = [j for j in range(K) if not (j < 8 and j in _PROBES_TIME_UNREAD)]
    src = np.broadcast_to(np.arange(K)[:, None], (K, C)).copy()  # per (probe, plan): the probe costed
    for jj, j in enumerate(read):
        for i in read[:jj]:
            same = src[j] == j
            for a, b in zip(cols[i], cols[j]):
                same &= a == b
            src[j] = np.where(same, src[i], src[j])
    costed = np.zeros((K, C), dtype=bool)
    costed[read] = src[read] == np.asarray(read)[:, None]
    which, idx = np.nonzero(costed)  # probe-major, as the stacked call of all 16 was
    pos = np.full((K, C), -1, dtype=np.int64)
    pos[which, idx] = np.arange(which.size)
    sp = plans.take(idx)
    col = lambda j, dtype: np.concatenate([c[j].astype(dtype)[costed[k]]  # noqa: E731
                                           for k, c in enumerate(cols)])
    rows_layer, rows_stack = _gather(layer, stack, shared, idx)
    mix = {} if stack is None else {"stack": rows_stack, "lead": col(5, float)}
    rc = rank_cost(ctx.model, ctx.cluster, ctx.training, sp, ctx.calib, rows_layer,
                   rank=col(0, np.int64), layers=col(1, np.int64), recomputed=col(2, np.int64),
                   has_embedding=col(3, bool), has_head=col(4, bool), totals=False, **mix)
    at = pos[src, np.arange(C)[None, :]]  # (K, C) row of each probe's value (-1: unread)

    def spread(values, lo, hi):
        v = np.broadcast_to(np.asarray(values, dtype=float), (which.size,))
        out = v[np.maximum(at[lo:hi], 0)]
        return np.where(at[lo:hi] >= 0, out, np.nan)

    return StageProbes(time_s=spread(rc.microbatch_s, 0, 8), extra_s=spread(rc.step_extra_s, 0, 8),
                       memory_bytes=spread(rank_fit_bytes(rc, sp, ctx.calib), 8, 16), lead=d)


_PROBES_TIME_UNREAD = (3, 4, 5)
"""Time probes :func:`stage_table` does not read (NaN in ``StageProbes.time_s`` / ``extra_s``)."""


def stage_table(ctx: CostContext, plans: PlanArrays, pp: int, vpp: int | np.ndarray,
                layer: LayerCost | None = None, probes: StageProbes | None = None) -> StageTable:
    """Affine per-rank costs of plans that all have ``pp`` ranks and ``vpp`` chunks per rank
    (one int, or the plans' own ``vpp`` column); ``probes`` is ``stage_probes`` of the same
    plans when the caller has it."""
    last = pp - 1
    probes = probes if probes is not None else stage_probes(ctx, plans, layer)
    t, x, mem = probes.time_s, probes.extra_s, probes.memory_bytes
    alpha = pipeline_alpha(ctx, plans)
    m = num_microbatches(ctx.training, plans)
    held = lambda r: np.asarray(in_flight_chunks(r, plans.pp, plans.vpp, m, plans.schedule,  # noqa: E731
                                                 plans.vocab_parallel), float)
    h0, hl = held(0), held(last)

    a = t[1] - t[0]
    b = t[2] - t[1]
    xa = x[1] - x[0]
    s0, sl = mem[1] - mem[0], mem[5] - mem[4]
    diff = h0 != hl
    d = np.where(diff, (s0 - sl) / np.where(diff, h0 - hl, 1.0), 0.0)
    c = s0 - h0 * d
    allow = plans.recompute != RECOMPUTES.index(Recompute.NONE)
    step2 = mem[3] - mem[2]  # -h0 * saving per recomputed layer (no jump between r=1 and r=2)
    saving = np.where(allow & (h0 > 0), -step2 / np.where(h0 > 0, h0, 1.0), 0.0)
    jump = np.where(allow, (mem[2] - mem[1]) - step2, 0.0)
    # Per-rank intercepts: plain ranks, then the embedding rank 0 and the head rank p-1.
    ranks = np.arange(pp)
    h = np.asarray(in_flight_chunks(ranks[None, :], plans.pp[:, None], plans.vpp[:, None],
                                    m[:, None], plans.schedule[:, None], plans.vocab_parallel[:, None]), float)
    n0 = float(MEMORY_PROBE_LAYERS)
    e_plain = (t[0] - a) + (x[0] - xa) / alpha
    f_plain = mem[0] - n0 * (c + h0 * d)
    e = np.repeat(e_plain[:, None], pp, axis=1)
    f = np.repeat(f_plain[:, None], pp, axis=1)
    ye = np.repeat(((x[0] - xa) / alpha)[:, None], pp, axis=1)  # the tails' part of e (StageTable.rank_tail_s)
    # The embedding rank's probes hold n0 layers and the leading dense ones (n0 = 1 for time).
    n6, n6_mem = 1.0 + probes.lead, n0 + probes.lead
    n7, n7_mem = np.where(plans.pp == 1, n6, 1.0), np.where(plans.pp == 1, n6_mem, n0)
    ye[:, last] = (x[7] - n7 * xa) / alpha
    e[:, last] = (t[7] - n7 * a) + ye[:, last]
    f[:, last] = mem[7] - n7_mem * (c + hl * d)
    ye[:, 0] = (x[6] - n6 * xa) / alpha
    e[:, 0] = (t[6] - n6 * a) + ye[:, 0]
    f[:, 0] = mem[6] - n6_mem * (c + h0 * d)
    return StageTable(
        layer_time_s=a + xa / alpha, recompute_time_s=np.where(allow, b, 0.0), layer_static_bytes=c,
        layer_act_bytes=d, layer_act_recomputed_bytes=d - np.where(h0 > 0, saving, 0.0),
        rank_time_s=e, rank_bytes=f, inflight=h, allow_recompute=allow,
        num_layers=ctx.model.num_layers, chunks=vpp, recompute_jump_bytes=jump,
        layer_tail_s=xa / alpha, rank_tail_s=ye)


def rank_fit_bytes(rc, plans: PlanArrays, calib: Calibration) -> np.ndarray:
    """The memory figure the search ranks a rank on: the device peak "fits" compares with the GPU's
    memory (cost.device_memory.fit_bytes), for the ``RankCost`` ``rc`` of ``plans``."""
    return fit_bytes(rc.memory_bytes, rc.reserve_bytes, plans, calib)


def fit_step_peak(ctx: CostContext, plans: PlanArrays, ranks: list) -> StepPeak:
    """``compose_step_peak`` of the ranks, with the peak the largest :func:`rank_fit_bytes`:
    step time and the memory figure the search compares with the GPU's memory."""
    def most(values):
        out = np.asarray(values[0])
        for x in values[1:]:
            out = np.maximum(out, x)
        return out

    return compose_maxima(ctx.training, plans, ctx.calib, microbatch_s=most([r.microbatch_s for r in ranks]),
                          step_extra_s=most([r.step_extra_s for r in ranks]),
                          memory_bytes=most([rank_fit_bytes(r, plans, ctx.calib) for r in ranks]),
                          host_bytes=most([r.host_bytes for r in ranks]))
