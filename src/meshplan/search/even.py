"""Every global configuration scored with an even layer split (what ``estimate_batch`` computes,
keeping the figures the search reads), with dominance pruning (:mod:`meshplan.search.prune`):
step 2 of :mod:`meshplan.search.planner`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import StepPeak, compose_step_peak, even_lead, middle_rank, plan_terms, rank_cost
from meshplan.cost.rank_layers import StackLayers
from meshplan.cost.layer import LayerCost
from meshplan.cost.pipeline import rank_layers_even
from meshplan.search.frontier import Front, dominated_by
from meshplan.search.prune import EvenPoints, settle
from meshplan.search.tables import CostContext, SharedLayerCost


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
    exact: np.ndarray | None = None
    """Rows scored in full; the others hold a lower bound that a scored plan beats even after
    the refinement test's shrink (:mod:`meshplan.search.prune`). None: every row."""

    def candidates(self, even_front: Front, shrink: float) -> np.ndarray:
        """Rows whose point, ``shrink`` times faster and leaner, ``even_front`` does not
        dominate (the refinement test); a bounded row is none (that is why it was not scored)."""
        rows = np.flatnonzero(self.exact) if self.exact is not None else slice(None)
        out = np.zeros(self.step_time_s.shape, dtype=bool)
        out[rows] = ~dominated_by(even_front.time_s, even_front.memory_bytes,
                                  self.step_time_s[rows] * shrink, self.peak_memory_bytes[rows] * shrink)
        return out


def even_estimate(ctx: CostContext, plans: PlanArrays, shared: SharedLayerCost, *,
                   prune_shrink: float | None = None, budget_bytes: float = np.inf) -> tuple[EvenCost, int]:
    """What ``estimate_batch`` computes (even split, policy on every layer: the first and the
    last rank bound the step and the peak), with the layer costs shared between rows; in
    slices of EVEN_CHUNK_ROWS, keeping only the two figures the search reads.

    With ``prune_shrink`` (the refinement test's factor) the first rank is scored alone first
    and configurations whose bound is beaten keep the bound (:mod:`meshplan.search.prune`).
    Returns the points and how many configurations kept a bound."""
    n = len(plans)
    step, peak, host = np.empty(n), np.empty(n), np.zeros(n)
    first_only = prune_shrink is not None
    for i in range(0, n, EVEN_CHUNK_ROWS):
        rows = slice(i, i + EVEN_CHUNK_ROWS)
        est = even_slice(ctx, plans.take(rows), shared.take(rows), first_only=first_only,
                         stack=shared.take_stack(rows))
        step[rows], peak[rows], host[rows] = est.step_time_s, est.peak_memory_bytes, est.host_memory_bytes
    if not first_only:
        return EvenCost(step_time_s=step, peak_memory_bytes=peak, host_memory_bytes=host), 0

    def exact(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = [even_slice(ctx, plans.take(r), shared.take(r), stack=shared.take_stack(r))
               for r in np.array_split(rows, max(1, -(-rows.size // EVEN_CHUNK_ROWS)))]
        return tuple(np.concatenate([getattr(e, f) * np.ones(len(e.step_time_s)) for e in out])
                     for f in ("step_time_s", "peak_memory_bytes", "host_memory_bytes"))

    bound = EvenPoints(step, peak, host, exact=plans.pp == 1)  # one rank: the bound is exact
    pts, _ = settle(bound, exact, shrink=prune_shrink, budget_bytes=budget_bytes, overwrite=True)  # our scratch
    return (EvenCost(step_time_s=pts.step_time_s, peak_memory_bytes=pts.peak_memory_bytes,
                     host_memory_bytes=pts.host_memory_bytes, exact=pts.exact), int(np.count_nonzero(~pts.exact)))


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
        return compose_step_peak(ctx.training, plans, [first], ctx.calib)
    ll = rank_layers_even(L, last, plans.pp, plans.vpp)
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True,
                      **even_lead(ctx.model, kw, last, plans))
    return compose_step_peak(ctx.training, plans, [first, final, *middle_rank(ctx.model, plans, ctx.calib, kw)],
                             ctx.calib)


