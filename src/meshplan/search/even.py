"""Every global configuration scored with an even layer split (what ``estimate_batch`` computes,
keeping the figures the search reads), with dominance pruning (:mod:`meshplan.search.prune`):
step 2 of :mod:`meshplan.search.planner`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import StepPeak, even_lead, middle_rank, plan_terms, rank_cost
from meshplan.cost.rank_layers import StackLayers, needs_rank_mix
from meshplan.cost.layer import LayerCost
from meshplan.cost.pipeline import rank_layers_even
from meshplan.search.frontier import Front, dominated_by
from meshplan.search.prune import EvenPoints, settle
from meshplan.search.tables import CostContext, SharedLayerCost, _take_layer, fit_step_peak


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
    mixed = needs_rank_mix(ctx.model)  # no balanced bound (:func:`balanced_slice`): the slack alone
    balanced = np.full(n, np.inf)
    for i in range(0, n, EVEN_CHUNK_ROWS):
        rows = slice(i, i + EVEN_CHUNK_ROWS)
        sub, sub_layer, stack = plans.take(rows), shared.take(rows), shared.take_stack(rows)
        est = (balanced_slice(ctx, sub, sub_layer, stack) if bound_only
               else even_slice(ctx, sub, sub_layer, stack=stack))
        step[rows], peak[rows], host[rows] = est.step_time_s, est.peak_memory_bytes, est.host_memory_bytes
        if mixed:
            continue
        balanced[rows] = est.step_time_s  # the bound, or the even split: with one rank, the same
        many = None if bound_only else np.flatnonzero(sub.pp > 1)
        if many is not None and many.size:  # scored in full: a pipeline's rows need the bound's pass
            balanced[i + many] = balanced_slice(ctx, sub.take(many), _take_layer(sub_layer, many)).step_time_s
    if not bound_only:
        return EvenCost(step_time_s=step, peak_memory_bytes=peak, host_memory_bytes=host,
                        balanced_time_s=balanced), 0

    def exact(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = [even_slice(ctx, plans.take(r), shared.take(r), stack=shared.take_stack(r))
               for r in np.array_split(rows, max(1, -(-rows.size // EVEN_CHUNK_ROWS)))]
        return tuple(np.concatenate([getattr(e, f) * np.ones(len(e.step_time_s)) for e in out])
                     for f in ("step_time_s", "peak_memory_bytes", "host_memory_bytes"))

    bound = EvenPoints(step, peak, host, exact=plans.pp == 1)  # one rank: the bound is exact
    pts, _ = settle(bound, exact, shrink=prune_shrink, budget_bytes=budget_bytes, overwrite=True)  # our scratch
    return (EvenCost(step_time_s=pts.step_time_s, peak_memory_bytes=pts.peak_memory_bytes,
                     host_memory_bytes=pts.host_memory_bytes, balanced_time_s=balanced, exact=pts.exact),
            int(np.count_nonzero(~pts.exact)))


def even_slice(ctx: CostContext, plans: PlanArrays, layer: LayerCost, first_only: bool = False,
               stack: StackLayers | None = None) -> StepPeak:
    """The even split's estimate; with ``first_only`` the first rank's alone (a lower bound,
    exact with one rank: :mod:`meshplan.search.prune`). ``stack``: each rank charged the kinds
    it holds, as ``estimate_batch`` does (cost/rank_layers.py)."""
    kw = dict(model=ctx.model, cluster=ctx.cluster, training=ctx.training, plans=plans,
              calib=ctx.calib, layer=layer)
    kw["terms"] = plan_terms(**kw)  # shared by both ranks
    if stack is not None:
        kw["stack"] = stack
    kw["totals"] = False  # the search reads the step and the memory only
    L, last = ctx.model.num_layers, plans.pp - 1
    l0 = rank_layers_even(L, 0, plans.pp, plans.vpp)
    first = rank_cost(**kw, rank=0, layers=l0, recomputed=l0, has_embedding=True, has_head=plans.pp == 1,
                      **even_lead(ctx.model, kw, 0, plans))
    if first_only:
        return fit_step_peak(ctx, plans, [first])
    ll = rank_layers_even(L, last, plans.pp, plans.vpp)
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True,
                      **even_lead(ctx.model, kw, last, plans))
    return fit_step_peak(ctx, plans, [first, final, *middle_rank(ctx.model, plans, ctx.calib, kw)])


def balanced_slice(ctx: CostContext, plans: PlanArrays, layer: LayerCost,
                   stack: StackLayers | None = None) -> StepPeak:
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

    A model whose ranks are charged their own kinds of layers (leading dense layers, MTP modules:
    ``cost.rank_layers.needs_rank_mix``) has no mean rank of one kind: there the bound is the even
    split's first rank alone (``stack`` its kinds), below the even split only, and the
    refinement test reads no balanced time (:func:`even_estimate`: the slack alone)."""
    if needs_rank_mix(ctx.model):
        return even_slice(ctx, plans, layer, first_only=True, stack=stack)
    kw = dict(model=ctx.model, cluster=ctx.cluster, training=ctx.training, plans=plans,
              calib=ctx.calib, layer=layer)
    kw["terms"] = plan_terms(**kw)
    kw["totals"] = False  # the search reads the step and the memory only
    L, one = ctx.model.num_layers, plans.pp == 1
    mean = np.where(one, L, L / plans.pp)
    rank = rank_cost(**kw, rank=0, layers=mean, recomputed=mean, has_embedding=one, has_head=one)
    return fit_step_peak(ctx, plans, [rank])
