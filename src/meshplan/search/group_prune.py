"""Dominance pruning of whole groups of configurations before they are enumerated.

A *group* (``space.GROUP_COLUMNS``: the mesh degrees, ZeRO stage, sequence parallel, CP method,
ep and etp) is crossed with every schedule and virtual-stage count, micro-batch size and
recompute policy (and module set): 50-100 configurations per group on MoE models, 10-20M in all
for DeepSeek-V3 or Qwen3-30B on 256 GPUs. :mod:`meshplan.search.prune` bounds each configuration
by its first pipeline rank; this module bounds a whole group by less than that bound of every one
of its configurations, so a group that a known plan beats is dropped before it is crossed.

The bound reads the cost model's own terms (``rank_cost``, ``layer_cost``), keeping only those
that no crossed choice can lower (Narayanan et al. 2021 Sec. 2.2's step = m t + bubble):

* time: the first rank's step is ``m t_mb + bubble + tail`` (``compose`` over that rank), with
  ``t_mb`` at least its layers' forward + backward math and exposed TP/CP/EP communication
  (``layer_cost``: a function of the micro-batch and module set, not of the schedule or the
  policy) plus the host's per-micro-batch work; recompute, pipeline p2p, ZeRO-3 gathers and the
  embedding / head only add to it. ``m = B / (dp mb)``; the bubble's factor is its least over
  the group's schedules; the tail holds at least the optimizer step (states only). The bound is
  the least over the group's micro-batch sizes and module sets, at the fewest layers any of its
  virtual-stage counts puts on the first rank.
* memory: at least the first rank's weights, gradients and optimizer states at the fewest
  layers, the allocator's reserve on those, the communication buckets, the framework's overhead
  and ZeRO-3's gathered layers (activations, receive buffers and the optimizer step's excess are
  non-negative); none depends on a crossed choice except through the zero-bubble schedule, whose
  unsharded gradients and stage only add.

A group is dropped when :func:`meshplan.search.prune.prunable` holds for its bound against plans
already scored exactly: then it holds for the first-rank bound of each of its configurations
(prunable is monotone: a larger bound is dominated whenever a smaller one is), so the search
without this step would have kept every one of them unscored, and its frontier, refinement
candidates and held-back rows are the ones found here
(tests/planner/test_search_group_prune.py checks the bound against every configuration's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshplan.cost.arrays import PlanArrays, RC_NONE
from meshplan.cost.batch import rank_cost
from meshplan.cost.pipeline import bubble_time, rank_layers_even
from meshplan.plan import Recompute
from meshplan.search.frontier import Front, pareto_indices
from meshplan.search.prune import prunable
from meshplan.search.space import (RECOMPUTES, GROUP_COLUMNS, SearchOptions, _rule_schedule, _schedule_pairs,
                                   cross_groups, divisors, module_codes, take_groups)
from meshplan.search.tables import LAYER_KEY_FIELDS, CostContext, shared_layer_cost
from meshplan.spec.cluster import GIB

GROUP_PRUNE_MIN_CONFIGS = 1 << 20
"""``search`` prunes groups when its space holds more configurations than this (and it prunes
configurations at all: ``even.PRUNE_MIN_CONFIGS``)."""

GROUP_SEED_ROUNDS = 4
"""Rounds of exact scoring before the groups are pruned: each round scores the surviving groups
of the least bound time (the first: the frontier of the groups' bounds) and prunes the rest
against every plan scored so far."""

GROUP_SEED_GROUPS = 64
"""Groups scored per seeding round after the first."""


@dataclass(frozen=True)
class GroupBounds:
    """Per group: a lower bound on the first-rank step time and peak memory of every one of its
    configurations (:func:`group_bounds`)."""

    time_s: np.ndarray
    memory_bytes: np.ndarray


def _columns(groups: dict[str, np.ndarray], n: int, extra: dict[str, np.ndarray]) -> PlanArrays:
    cols = {k: groups[k] for k in GROUP_COLUMNS}
    cols.update(extra)
    cols.setdefault("recompute_modules", np.zeros(n, dtype=np.int64))
    return PlanArrays(**cols, offload=np.zeros(n, dtype=np.int64))


def group_bounds(ctx: CostContext, groups: dict[str, np.ndarray], options: SearchOptions) -> GroupBounds:
    """The bound of the module docstring for every group."""
    model, training, calib = ctx.model, ctx.training, ctx.calib
    g = groups["pp"].size
    sched, vpp = _schedule_pairs(options, model)
    # Per pipeline degree: the fewest first-rank layers and the least bubble factor over the
    # schedules and virtual-stage counts _rule_schedule keeps for it.
    pps = np.unique(groups["pp"])
    pair_pp = np.repeat(pps, sched.size)
    pair_s, pair_v = np.tile(sched, pps.size), np.tile(vpp, pps.size)
    legal = _rule_schedule({"pp": pair_pp, "schedule": pair_s, "vpp": pair_v}, model, options).reshape(pps.size, -1)
    layers0 = np.where(legal, rank_layers_even(model.num_layers, 0, pair_pp, pair_v).reshape(legal.shape), np.inf)
    bubble = np.where(legal, bubble_time(1.0, pair_pp, pair_v, pair_s, calib).reshape(legal.shape), np.inf)
    at = np.searchsorted(pps, groups["pp"])
    fewest = layers0.min(axis=1)[at]
    least_bubble = bubble.min(axis=1)[at]

    # Per micro-batch: every size dividing the global batch that divides the group's replica
    # batch (a superset of the legal ones), with each module set searched. The layer's cost
    # depends on the group through the layer-key columns only: it is computed once per distinct
    # such row, size and module set, and read by every group that shares them.
    key_cols = [k for k in LAYER_KEY_FIELDS if k in GROUP_COLUMNS]
    key = np.zeros(g, dtype=np.int64)
    for k in key_cols:
        col = groups[k].astype(np.int64)
        key = key * (int(col.max(initial=0)) + 1) + col
    _, first_of, key_of = np.unique(key, return_index=True, return_inverse=True)
    key_of = key_of.reshape(-1)
    sizes = np.array(divisors(training.global_batch), dtype=np.int64)
    codes = np.concatenate(([0], module_codes(model, options))).astype(np.int64)
    k_n, s_n, c_n = first_of.size, sizes.size, codes.size
    dp = groups["dp_replicate"] * groups["dp_shard"]
    per_dp = training.global_batch // dp
    legal_mb = per_dp[:, None] % sizes[None, :] == 0  # (groups, sizes)
    used = np.zeros((k_n, s_n), dtype=bool)  # (key, size) pairs some group can run
    np.logical_or.at(used, key_of, legal_mb)
    ks, si = np.nonzero(used)
    ki, mb, mod = np.repeat(first_of[ks], c_n), np.repeat(sizes[si], c_n), np.tile(codes, ks.size)
    selective = RECOMPUTES.index(Recompute.SELECTIVE)
    rows = _columns(take_groups(groups, ki), ki.size,
                    {"schedule": np.full(ki.size, int(sched[0])), "vpp": np.ones(ki.size, dtype=np.int64),
                     "micro_batch": mb, "recompute": np.where(mod > 0, selective, RC_NONE),
                     "recompute_modules": mod})
    lc = shared_layer_cost(ctx, rows)
    per_row = (lc.unique.fwd_compute_s + lc.unique.bwd_compute_s
               + lc.unique.fwd_comm_exposed_s + lc.unique.bwd_comm_exposed_s)[lc.row]
    per_layer = np.zeros((k_n, s_n))  # the least over module sets, per (layer key, size) some group runs
    per_layer[ks, si] = per_row.reshape(ks.size, c_n).min(axis=1)

    # States and optimizer step: one probe per group (the first listed schedule with one chunk,
    # micro-batch 1, no recompute: none of them changes these), at the fewest layers.
    base = {"schedule": np.full(g, int(sched[0])), "vpp": np.ones(g, dtype=np.int64),
            "micro_batch": np.ones(g, dtype=np.int64), "recompute": np.full(g, RC_NONE)}
    probe = _columns(groups, g, base)
    at_one = np.searchsorted(ks * s_n + si, key_of * s_n + 0) * c_n  # rows (key, size 1, set 0)
    layer = lc.take(at_one)
    first = rank_cost(model, ctx.cluster, training, probe, calib, layer, rank=0, layers=fewest, recomputed=0,
                      has_embedding=True, has_head=groups["pp"] == 1, totals=False)
    states = first.parameters_bytes + first.gradients_bytes + first.optimizer_bytes
    # Of the rest (cost.memory.rank_other): the communication buckets, the framework's overhead,
    # ZeRO-3's gathered layers (depend on no crossed choice but the zero-bubble schedule's, which
    # keeps more) and the allocator's reserve on the states alone.
    memory = (states * (1.0 + calib.allocator_fragmentation) + first.gathered_weight_bytes
              + calib.comm_bucket_bytes + calib.framework_overhead_gib * GIB)
    tail = first.optimizer_s

    m = np.where(legal_mb, per_dp[:, None] // sizes[None, :], 0)  # micro-batches, per group and size
    t_mb = fewest[:, None] * per_layer[key_of] + calib.microbatch_overhead_s
    step = np.where(legal_mb, (m + least_bubble[:, None]) * t_mb, np.inf)
    time_s = step.min(axis=1)
    return GroupBounds(time_s=time_s + tail, memory_bytes=memory)


def surviving_groups(groups: dict[str, np.ndarray], bounds: GroupBounds,
                     score: Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]], *,
                     shrink: float, budget_bytes: float) -> tuple[np.ndarray, int]:
    """Mask of the groups whose bound no plan scored here beats (:func:`prunable`), and how many
    configurations were scored. ``score(groups)`` returns the exact even (step, peak) of the
    configurations of those groups that it scored exactly (any subset: only exact points prune).
    Rounds as :func:`meshplan.search.prune.settle`: the frontier of the bounds first, then the
    surviving groups of least bound time."""
    alive = np.ones(bounds.time_s.size, dtype=bool)
    if shrink <= 0.0 or alive.size == 0:
        return alive, 0
    seen = np.zeros(alive.size, dtype=bool)
    known_t, known_m = np.empty(0), np.empty(0)
    scored = 0
    for round_ in range(GROUP_SEED_ROUNDS):
        open_ = np.flatnonzero(alive & ~seen)
        if open_.size == 0:
            break
        if round_ == 0:
            pick = open_[pareto_indices(bounds.time_s[open_], bounds.memory_bytes[open_])]
        else:
            pick = open_[np.argsort(bounds.time_s[open_], kind="stable")[:GROUP_SEED_GROUPS]]
        pick = np.sort(pick)
        seen[pick] = True
        t, m = score(take_groups(groups, pick))
        scored += t.size
        known_t, known_m = np.concatenate([known_t, t]), np.concatenate([known_m, m])
        known = Front.of(known_t, known_m, np.arange(known_t.size))
        known_t, known_m = known.time_s, known.memory_bytes
        fits = known_m <= budget_bytes
        fastest_fitting = float(known_t[fits].min()) if fits.any() else np.inf
        alive &= ~prunable(known, bounds.time_s, bounds.memory_bytes, shrink=shrink,
                           fastest_fitting_s=fastest_fitting)
    return alive, scored


def prune_groups(ctx: CostContext, groups: dict[str, np.ndarray], options: SearchOptions, *,
                 shrink: float, budget_bytes: float) -> tuple[np.ndarray, int]:
    """:func:`surviving_groups` with each seed group's configurations scored by the even pass
    (itself pruned, :func:`meshplan.search.even.even_estimate`)."""
    from meshplan.search.even import even_estimate

    def score(seed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        plans = cross_groups(seed, ctx.model, ctx.training, options)
        est, _ = even_estimate(ctx, plans, shared_layer_cost(ctx, plans), prune_shrink=shrink,
                               budget_bytes=budget_bytes)
        return est.step_time_s[est.exact], est.peak_memory_bytes[est.exact]

    return surviving_groups(groups, group_bounds(ctx, groups, options), score, shrink=shrink,
                            budget_bytes=budget_bytes)
