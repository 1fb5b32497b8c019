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
    balance: np.ndarray | None = None
    """Per row, the ranks' mean micro-batch time over the slowest's (:func:`rank_balance`);
    None: not known (the refinement test then uses its fixed shrink alone)."""

    def candidates(self, even_front: Front, shrink: float) -> np.ndarray:
        """Rows whose point, ``shrink`` times faster and leaner, ``even_front`` does not
        dominate (the refinement test); a bounded row is none (that is why it was not scored).
        A row whose ranks are out of balance by more than the shrink (a heavy LM head on the
        last of two ranks) is tested at its balanced time instead: an uneven split can take
        its time down to the ranks' mean, not only by ``shrink``."""
        rows = np.flatnonzero(self.exact) if self.exact is not None else slice(None)
        out = np.zeros(self.step_time_s.shape, dtype=bool)
        time_shrink = shrink if self.balance is None else np.minimum(
            shrink, self.balance[rows] * (1.0 - BALANCE_MARGIN))
        out[rows] = ~dominated_by(even_front.time_s, even_front.memory_bytes,
                                  self.step_time_s[rows] * time_shrink, self.peak_memory_bytes[rows] * shrink)
        return out


BALANCE_MARGIN = 0.05
"""The balanced time (ranks' mean micro-batch time) is lowered by this fraction in the refinement
test: a rank's time is affine in its layer count with the same slope on every rank only up to its
communication overlap terms (``comms.exposed``, a min of two lines), as PRUNE_MARGIN says of the
per-rank tables (meshplan.search.planner)."""


def rank_balance(ranks: list, pp: np.ndarray) -> np.ndarray:
    """Mean over the ``pp`` ranks of their micro-batch time, over the slowest rank's: the least
    fraction of the even split's time that any split of the same layers reaches (moving layers
    between ranks keeps their sum when every rank's time is affine in its layers with one slope).
    ``ranks`` are the first and the last rank's costs, and a middle rank's when scored; without
    one a middle rank is taken at the cheaper end's time (the ends carry the embedding and the
    LM head: a middle rank is rarely dearer)."""
    first, last = ranks[0].microbatch_s, ranks[1].microbatch_s
    mid = ranks[2].microbatch_s if len(ranks) > 2 else np.minimum(first, last)
    p = np.asarray(pp, dtype=float)
    total = np.where(p > 1, first + last + np.maximum(p - 2.0, 0.0) * mid, first)
    slowest = np.maximum(np.maximum(first, last), mid)
    return np.clip(total / np.maximum(p, 1.0) / np.where(slowest > 0, slowest, 1.0), 0.0, 1.0)


def even_estimate(ctx: CostContext, plans: PlanArrays, shared: SharedLayerCost, *,
                   prune_shrink: float | None = None, budget_bytes: float = np.inf) -> tuple[EvenCost, int]:
    """What ``estimate_batch`` computes (even split, policy on every layer: the first and the
    last rank bound the step and the peak), with the layer costs shared between rows; in
    slices of EVEN_CHUNK_ROWS, keeping only the two figures the search reads.

    With ``prune_shrink`` (the refinement test's factor) the first rank is scored alone first
    and configurations whose bound is beaten keep the bound (:mod:`meshplan.search.prune`).
    Returns the points and how many configurations kept a bound."""
    n = len(plans)
    step, peak, host, balance = np.empty(n), np.empty(n), np.zeros(n), np.ones(n)
    first_only = prune_shrink is not None
    for i in range(0, n, EVEN_CHUNK_ROWS):
        rows = slice(i, i + EVEN_CHUNK_ROWS)
        est = even_slice(ctx, plans.take(rows), shared.take(rows), first_only=first_only)
        step[rows], peak[rows], host[rows] = est.step_time_s, est.peak_memory_bytes, est.host_memory_bytes
        if not first_only:
            balance[rows] = est.balance
    if not first_only:
        return EvenCost(step_time_s=step, peak_memory_bytes=peak, host_memory_bytes=host, balance=balance), 0

    def exact(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = np.array_split(rows, max(1, -(-rows.size // EVEN_CHUNK_ROWS)))
        out = [even_slice(ctx, plans.take(r), shared.take(r)) for r in parts]
        for r, e in zip(parts, out):
            balance[r] = e.balance  # this call's own scratch array, read once settled
        return tuple(np.concatenate([getattr(e, f) * np.ones(len(e.step_time_s)) for e in out])
                     for f in ("step_time_s", "peak_memory_bytes", "host_memory_bytes"))

    bound = EvenPoints(step, peak, host, exact=plans.pp == 1)  # one rank: the bound is exact
    pts, _ = settle(bound, exact, shrink=prune_shrink, budget_bytes=budget_bytes, overwrite=True)  # our scratch
    return (EvenCost(step_time_s=pts.step_time_s, peak_memory_bytes=pts.peak_memory_bytes,
                     host_memory_bytes=pts.host_memory_bytes, exact=pts.exact, balance=balance), int(np.count_nonzero(~pts.exact)))


@dataclass(frozen=True)
class EvenSlice(StepPeak):
    """:class:`StepPeak` of an even split with the ranks' balance (:func:`rank_balance`; 1 where
    only the first rank was scored)."""

    balance: np.ndarray | float = 1.0


def even_slice(ctx: CostContext, plans: PlanArrays, layer: LayerCost, first_only: bool = False) -> EvenSlice:
    """The even split's estimate; with ``first_only`` the first rank's alone (a lower bound,
    exact with one rank: :mod:`meshplan.search.prune`)."""
    kw = dict(model=ctx.model, cluster=ctx.cluster, training=ctx.training, plans=plans,
              calib=ctx.calib, layer=layer)
    kw["terms"] = plan_terms(**kw)  # shared by both ranks
    kw["totals"] = False  # the search reads the step and the memory only
    L, last = ctx.model.num_layers, plans.pp - 1
    l0 = rank_layers_even(L, 0, plans.pp, plans.vpp)
    first = rank_cost(**kw, rank=0, layers=l0, recomputed=l0, has_embedding=True, has_head=plans.pp == 1)
    if first_only:
        return EvenSlice(**vars(compose_step_peak(ctx.training, plans, [first], ctx.calib)))
    ll = rank_layers_even(L, last, plans.pp, plans.vpp)
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True)
    ranks = [first, final, *middle_rank(ctx.model, plans, ctx.calib, kw)]
    return EvenSlice(**vars(compose_step_peak(ctx.training, plans, ranks, ctx.calib)),
                     balance=rank_balance(ranks, plans.pp))


