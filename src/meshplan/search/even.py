"""Every global configuration scored with an even layer split (what ``estimate_batch`` computes,
keeping the figures the search reads), with dominance pruning (:mod:`meshplan.search.prune`):
step 2 of :mod:`meshplan.search.planner`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import StepPeak, compose_step_peak, middle_rank, plan_terms, rank_cost
from meshplan.cost.layer import LayerCost
from meshplan.cost.pipeline import rank_layers_even
from meshplan.search.frontier import Front, dominated_by
from meshplan.search.prune import EvenPoints, settle
from meshplan.search.tables import CostContext, SharedLayerCost, _take_layer


PRUNE_MIN_CONFIGS = 1 << 15
"""``search``'s default prunes (:mod:`meshplan.search.prune`) spaces larger than this; on smaller
ones the bound pass and its rounds cost about what they save (Llama-2-7B on 8 GPUs, 13,590
configurations: 17.4 ms pruned, 15.0 ms scored whole)."""

EVEN_CHUNK_ROWS = 1 << 16
"""Global configurations costed at once. Large spaces (millions of configurations for a few
thousand GPUs) are costed in slices of this many rows: a slice's ~100 temporary arrays then
stay in the CPU caches and are reused by the allocator instead of paging in gigabytes. (GPT-3
175B's first-rank bounds on the 2-core dev machine: 16k rows 254-306 ns a row, 32k 243-285, 64k
217-263, 128k 454-494: past 64k the temporaries leave the caches.)"""


@dataclass(frozen=True)
class EvenCost:
    """Step time and peak memory of every global configuration with an even layer split."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    host_memory_bytes: np.ndarray
    balanced_time_s: np.ndarray
    """Per row, the balanced-rank bound's step time (:func:`balanced_slice`): no layer split of
    the configuration (the even one included, its policy on every layer) is faster."""
    exact: np.ndarray | None = None
    """Rows scored in full; the others hold a lower bound that a scored plan beats even after
    the refinement test's shrink (:mod:`meshplan.search.prune`). None: every row."""

    def near(self, even_front: Front, shrink: float) -> np.ndarray:
        """Rows whose point, ``shrink`` times faster and leaner, ``even_front`` does not dominate:
        the configurations near the frontier (what the OSDP pass starts from); a bounded row is
        none (that is why it was not scored)."""
        return self._undominated(even_front, shrink, balanced=False)

    def candidates(self, even_front: Front, shrink: float) -> np.ndarray:
        """The refinement test: rows whose point, ``shrink`` times faster (or at the balanced
        bound's time where that is faster still) and ``shrink`` times leaner, ``even_front`` does
        not dominate. The shrink covers what moving recomputed layers trades; the balanced bound
        covers what moving layers between ranks (or spreading the head over them) can gain,
        however out of balance the even split is (a heavy LM head on the last of two ranks). A
        superset of :meth:`near`. A bounded row is none: its bound, shrunk, is beaten, and it is
        below both the even point and the balanced time (:func:`balanced_slice`)."""
        return self._undominated(even_front, shrink, balanced=True)

    def _undominated(self, even_front: Front, shrink: float, balanced: bool) -> np.ndarray:
        rows = np.flatnonzero(self.exact) if self.exact is not None else slice(None)
        out = np.zeros(self.step_time_s.shape, dtype=bool)
        time_s = self.step_time_s[rows] * shrink
        if balanced:
            time_s = np.minimum(time_s, self.balanced_time_s[rows])
        out[rows] = ~dominated_by(even_front.time_s, even_front.memory_bytes,
                                  time_s, self.peak_memory_bytes[rows] * shrink)
        return out


def even_estimate(ctx: CostContext, plans: PlanArrays, shared: SharedLayerCost, *,
                   prune_shrink: float | None = None, budget_bytes: float = np.inf) -> tuple[EvenCost, int]:
    """What ``estimate_batch`` computes (even split, policy on every layer: the first and the
    last rank bound the step and the peak), with the layer costs shared between rows; in
    slices of EVEN_CHUNK_ROWS, keeping only the two figures the search reads.

    Every row also gets its balanced-rank bound (:func:`balanced_slice`), which the refinement
    test reads. With ``prune_shrink`` (the refinement test's factor) that bound is the even
    point's lower bound: configurations whose bound is beaten keep it, unscored
    (:mod:`meshplan.search.prune`). Returns the points and how many configurations kept a bound."""
    n = len(plans)
    step, peak, host = np.empty(n), np.empty(n), np.zeros(n)
    bound_only = prune_shrink is not None
    balanced = np.empty(n)
    for i in range(0, n, EVEN_CHUNK_ROWS):
        rows = slice(i, i + EVEN_CHUNK_ROWS)
        sub, sub_layer = plans.take(rows), shared.take(rows)
        est = (balanced_slice if bound_only else even_slice)(ctx, sub, sub_layer)
        step[rows], peak[rows], host[rows] = est.step_time_s, est.peak_memory_bytes, est.host_memory_bytes
        balanced[rows] = est.step_time_s  # the bound, or the even split: with one rank, the same
        many = None if bound_only else np.flatnonzero(sub.pp > 1)
        if many is not None and many.size:  # scored in full: a pipeline's rows need the bound's pass
            balanced[i + many] = balanced_slice(ctx, sub.take(many), _take_layer(sub_layer, many)).step_time_s
    if not bound_only:
        return EvenCost(step_time_s=step, peak_memory_bytes=peak, host_memory_bytes=host,
                        balanced_time_s=balanced), 0

    def exact(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = [even_slice(ctx, plans.take(r), shared.take(r))
               for r in np.array_split(rows, max(1, -(-rows.size // EVEN_CHUNK_ROWS)))]
        return tuple(np.concatenate([getattr(e, f) * np.ones(len(e.step_time_s)) for e in out])
                     for f in ("step_time_s", "peak_memory_bytes", "host_memory_bytes"))

    bound = EvenPoints(step, peak, host, exact=plans.pp == 1)  # one rank: the bound is exact
    pts, _ = settle(bound, exact, shrink=prune_shrink, budget_bytes=budget_bytes, overwrite=True)  # our scratch
    return (EvenCost(step_time_s=pts.step_time_s, peak_memory_bytes=pts.peak_memory_bytes,
                     host_memory_bytes=pts.host_memory_bytes, balanced_time_s=balanced, exact=pts.exact),
            int(np.count_nonzero(~pts.exact)))


def even_slice(ctx: CostContext, plans: PlanArrays, layer: LayerCost) -> StepPeak:
    """The even split's estimate (the first and the last rank, and a middle one where it can
    hold the most)."""
    kw = _rank_kw(ctx, plans, layer)
    L, last = ctx.model.num_layers, plans.pp - 1
    l0 = rank_layers_even(L, 0, plans.pp, plans.vpp)
    first = rank_cost(**kw, rank=0, layers=l0, recomputed=l0, has_embedding=True, has_head=plans.pp == 1)
    ll = rank_layers_even(L, last, plans.pp, plans.vpp)
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True)
    return compose_step_peak(ctx.training, plans, [first, final, *middle_rank(ctx.model, plans, ctx.calib, kw)],
                             ctx.calib)


def balanced_slice(ctx: CostContext, plans: PlanArrays, layer: LayerCost) -> StepPeak:
    """The balanced-rank bound: ``compose`` over one *mean rank*, the first pipeline rank holding
    L / p layers (all recomputed under the plan's policy) and neither the embedding nor the LM
    head; with one rank, the even split itself. Its step time is below every layer split's of
    the configuration (policy on every layer), and its memory below the even split's.

    Why (the cost model's own terms; tests/planner/test_search_bruteforce.py checks it against
    every split of random small configurations). A rank's micro-batch time in ``rank_cost`` depends on
    the rank only through its layers n, recomputed layers r and shares of the embedding and the
    head. It is affine in (n, r) with non-negative coefficients (compute, exposed TP/CP/EP and
    ZeRO-3 per-layer collectives, recompute) and non-decreasing in the shares (their compute w
    and the exposed ZeRO-3 collective of their parameters c: ``w + exposed(c, o, w)`` grows with
    both). So over any split (sum n_s = L) the slowest rank is at least the mean, which is at
    least the mean rank's. The step's tail (exposed data-parallel reduction and optimizer) is
    ``c(n) - min(o c(n), w(n))`` plus terms affine in n, c and w affine in n: convex in n (a max
    of affine functions), and non-decreasing in the shares (more parameters to reduce). Every
    split has ranks with at most and at least L / p layers, and a convex function on an interval
    is at most its larger end: the largest tail is at least the mean rank's. ``compose`` is
    increasing in both maxima (Narayanan et al. 2021, Sec. 2.2: m t + (p - 1) / v t), so the
    bound holds for the step. Memory: the even split's first rank holds ceil(L / p) >= L / p
    layers (``rank_layers_even``) and the embedding, and memory grows with both.

    Multi-token-prediction modules (charged as layers on the last rank, with head passes) make
    the layer counts' mean (L + mtp) / p: the time bound is taken there (without the MTP head
    passes: less compute; recomputed layers L / p, the MTP modules are not), and the memory
    bound from the even split's first rank, which may hold fewer layers."""
    kw = _rank_kw(ctx, plans, layer)
    p, one = plans.pp, plans.pp == 1
    mtp = ctx.model.mtp_num_layers
    L = ctx.model.num_layers
    mean = np.where(one, L, (L + mtp) / p)
    rank = rank_cost(**kw, rank=0, layers=mean, recomputed=np.where(one, L, L / p), has_embedding=one,
                     has_head=one, has_mtp=one)  # (the MTP modules are not recomputed)
    bound = compose_step_peak(ctx.training, plans, [rank], ctx.calib)
    if not mtp:
        return bound
    l0 = rank_layers_even(L, 0, p, plans.vpp)
    first = compose_step_peak(ctx.training, plans, [rank_cost(**kw, rank=0, layers=l0, recomputed=l0,
                                                               has_embedding=True, has_head=one)], ctx.calib)
    return StepPeak(step_time_s=bound.step_time_s, bubble_s=bound.bubble_s,
                    peak_memory_bytes=first.peak_memory_bytes, host_memory_bytes=first.host_memory_bytes)


def _rank_kw(ctx: CostContext, plans: PlanArrays, layer: LayerCost) -> dict:
    kw = dict(model=ctx.model, cluster=ctx.cluster, training=ctx.training, plans=plans,
              calib=ctx.calib, layer=layer)
    kw["terms"] = plan_terms(**kw)  # shared by every rank
    kw["totals"] = False  # the search reads the step and the memory only
    return kw
