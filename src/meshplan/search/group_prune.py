"""Dominance pruning of configurations by the cell, before they are enumerated.

A *group* (``space.GROUP_COLUMNS``: the mesh degrees, ZeRO stage, sequence parallel, CP method,
ep and etp) is crossed with every schedule and virtual-stage count, micro-batch size and
recompute policy (and module set): 50-300 configurations per group on MoE models, 10-20M in all
for DeepSeek-V3 or Qwen3-30B on 256 GPUs. :mod:`meshplan.search.prune` bounds each configuration
by its first pipeline rank; this module bounds each *cell* (group, micro-batch size, recompute
choice) by less than that bound of every configuration of the cell, whatever its schedule and
virtual stages, so a cell that a known plan beats is never crossed.

The bound reads the cost model's own terms (``rank_cost``, ``layer_cost``, ``plan_terms``'
recompute and activation choices), keeping only those that no schedule can lower (Narayanan et
al. 2021 Sec. 2.2: step = m t + bubble):

* time: the first rank's step is ``m t_mb + bubble + tail`` (``compose`` over that rank), with
  ``t_mb`` at least its layers' forward + backward math, exposed TP/CP/EP communication and
  recompute under the policy (``layer_cost``: a function of the micro-batch and module set, not
  of the schedule) plus the host's per-micro-batch work; pipeline p2p, ZeRO-3 gathers and the
  embedding / head only add to it. ``m = B / (dp mb)``; the bubble's factor is its least over the
  group's schedules; the tail holds at least the optimizer step (states only). All at the fewest
  layers any of the group's virtual-stage counts puts on the first rank.
* memory (the device peak "fits" reads, ``cost.device_memory.fit_bytes``): at least the CUDA
  context and NCCL's buffers, the first rank's weights, gradients and optimizer states, the
  allocator's reserve on those and on the activations (none held under expandable segments), the
  communication buckets, the framework's overhead and ZeRO-3's gathered layers (receive buffers, logits and the optimizer step's excess are
  non-negative; the zero-bubble schedule's unsharded gradients and stage only add), and the
  activations of ``min(pp, m)`` micro-batches of the fewest layers under the policy (every
  schedule holds at least that many on the first rank: ``pipeline.in_flight_chunks``) plus the
  one layer a recomputing policy rematerialises (``memory.rank_activations``).

A cell is dropped when :func:`meshplan.search.prune.prunable` holds for its bound against plans
already scored exactly: then it holds for the first-rank bound of each of its configurations
(prunable is monotone: a larger bound is dominated whenever a smaller one is), so the search
without this step would have kept every one of them unscored, and its frontier, refinement
candidates and held-back rows are the ones found here. tests/planner/test_search_group_prune.py
checks the bound against every configuration's on random jobs (a change to the cost model that
breaks it fails there) and the search against ``prune=False``.

Of a kept cell, the configurations of one schedule and virtual-stage count are bounded again with
that pair's own bubble and fewest first-rank layers (:class:`PairTerms`; the cell's bound is the
least of these over the pairs) and the cell's memory bound, against the same plans, as the cell is
crossed (:class:`CellKeep`): 1F1B's bubble (p - 1) t is what a cell with an interleaved pair cannot
count on (GPT-3 175B on 3072 A100s: 1.34M -> 1.04M configurations crossed; DeepSeek-V3 on 256
GB200, ``--target megatron``: about three in four of the (row, recompute choice) pairs it bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from meshplan.cost.arrays import RC_FULL, RC_NONE, PlanArrays
from meshplan.cost.batch import rank_cost
from meshplan.cost.device_memory import held_fragmentation, outside_allocator_bytes
from meshplan.cost.pipeline import bubble_time, rank_layers_even
from meshplan.plan import Recompute
from meshplan.search.cell_survivors import (GROUP_SEED_GROUPS, GROUP_SEED_ROUNDS, CellKeep,  # noqa: F401
                                            beaten_at_s, surviving, take_rows)
from meshplan.search.space import (RECOMPUTES, GROUP_COLUMNS, SearchOptions, _rule_schedule, _schedule_pairs,
                                   cross_groups, micro_batch_sizes, module_codes, recompute_variants,
                                   take_groups)
from meshplan.search.tables import LAYER_KEY_FIELDS, CostContext, layer_cost_in_slices, shared_layer_cost
from meshplan.spec.cluster import GIB

GROUP_PRUNE_MIN_CONFIGS = 1 << 18
"""``search`` prunes cells when its space holds more configurations than this (and it prunes
configurations at all: ``even.PRUNE_MIN_CONFIGS``). Llama-3-70B on 1024 H100s (950k
configurations) goes from 0.59 to 0.40 s of CPU with it; the bound's layer costs are a fixed cost
that small spaces do not repay."""

@dataclass(frozen=True)
class GroupBounds:
    """Per group, micro-batch size (``space.micro_batch_sizes``) and recompute choice
    (``space.recompute_variants``): a lower bound on the first-rank step time and peak memory of
    every configuration of that group with that size and choice, whatever its schedule and
    virtual stages (:func:`group_bounds`); +inf where the size does not divide the group's
    replica batch (no configuration). Kept as its factors (per layer key, per group, per (group,
    size)): a cell's bound is computed where it is read (:meth:`cells`), the same operations in
    the same order for every cell, so a block's cells are bit for bit those of the whole arrays
    (:attr:`time_s`, :attr:`memory_bytes`)."""

    key_of: np.ndarray  # (groups,) row of the per-key tables
    per_layer_s: np.ndarray  # (keys, sizes, choices) a layer's time with its recompute
    act_policy_bytes: np.ndarray  # (keys, sizes, choices) a layer's activations under the policy
    act_extra_bytes: np.ndarray  # (keys, sizes, choices) the rematerialised layer's (0: no recompute)
    fewest_layers: np.ndarray  # (groups,)
    cycles: np.ndarray  # (groups, sizes) m + the least bubble factor
    held_layers: np.ndarray  # (groups, sizes) min(pp, m) x fewest layers
    tail_s: np.ndarray  # (groups,)
    fixed_bytes: np.ndarray  # (groups,) states with reserve, buckets, framework, outside the allocator
    legal: np.ndarray  # (groups, sizes) whether the size divides the group's replica batch
    overhead_s: float  # per micro-batch
    reserve: float  # 1 + the allocator's held fragmentation
    pair: PairTerms | None = None
    """What the time bound is made of, kept to bound a cell's configurations of one schedule and
    virtual-stage count (:meth:`PairTerms.time_s`); None: not kept."""

    @property
    def shape(self) -> tuple[int, int, int]:
        """(groups, sizes, choices)."""
        return (self.key_of.size, *self.per_layer_s.shape[1:])

    def cells(self, group: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, choices) time and memory bounds of the cells of each (group, size index)."""
        ok = take_rows(self.legal, group, size)  # (the arrays' [i, j], by flat rows: faster)
        return (self._time_s(take_rows(self.per_layer_s, self.key_of[group], size), group, size, ok),
                self._memory_bytes(group, size, ok))

    def _time_s(self, per_layer_s: np.ndarray, group: np.ndarray, size: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """The time bound at a layer time ``per_layer_s`` (blocks[, choices], written in place):
        increasing in it, one rounding per operation."""
        t = per_layer_s  # t_mb = fewest x per_layer + microbatch_overhead_s
        col = (slice(None),) + (None,) * (t.ndim - 1)
        t *= self.fewest_layers[group][col]
        t += self.overhead_s
        t *= take_rows(self.cycles, group, size)[col]  # (m + bubble) t_mb + tail
        t += self.tail_s[group][col]
        t[~ok] = np.inf
        return t

    def _memory_bytes(self, group: np.ndarray, size: np.ndarray, ok: np.ndarray) -> np.ndarray:
        # Activations (cost.memory.rank_activations): every schedule holds at least min(pp, m)
        # micro-batches of the first rank's layers at its peak (1F1B pp, interleaved pp + (pp-1)/v,
        # GPipe m; capped at m), plus the one rematerialised layer of a recomputing policy.
        key = self.key_of[group]
        mem = take_rows(self.act_policy_bytes, key, size)
        mem *= take_rows(self.held_layers, group, size)[:, None]
        mem += take_rows(self.act_extra_bytes, key, size)
        mem *= self.reserve  # the states' part + the activations' with the allocator's reserve
        mem += self.fixed_bytes[group][:, None]
        mem[~ok] = np.inf
        return mem

    def _all(self) -> tuple[np.ndarray, np.ndarray]:
        g_n, s_n, c_n = self.shape
        group, size = np.divmod(np.arange(g_n * s_n), s_n)
        t, m = self.cells(group, size)
        return t.reshape(g_n, s_n, c_n), m.reshape(g_n, s_n, c_n)

    @property
    def time_s(self) -> np.ndarray:
        """(groups, sizes, choices) every cell's time bound (the search reads blocks: :meth:`cells`)."""
        return self._all()[0]

    @property
    def memory_bytes(self) -> np.ndarray:
        """(groups, sizes, choices) every cell's memory bound."""
        return self._all()[1]

    def corners(self) -> tuple[np.ndarray, np.ndarray]:
        """(groups, sizes): per block a time and a memory below those of each of its cells (so a
        corner that a known plan beats beats every cell: :func:`meshplan.search.prune.prunable`
        is monotone); inf where the size is illegal. Each operation of a cell's bound is
        increasing in its operands and rounds monotonically, so the bound at the least operands
        over the choices is below every cell: the time at the least layer time is the least cell
        time (a NaN cell, never alive, ignored); the memory at the least activations and least
        rematerialised layer (apart: DeepSeek-V3 on 1024 GB200 keeps 200k blocks of 1.67M on
        it, 177k on the least cell memory, which costs all 18M cells) keeps a NaN (never beaten)."""
        g_n, s_n, c_n = self.shape
        t_lo, m_lo = np.full(g_n * s_n, np.inf), np.full(g_n * s_n, np.inf)
        blocks = np.flatnonzero(self.legal.reshape(-1))
        group, size = np.divmod(blocks, s_n)
        key, ok = self.key_of[group], np.ones(blocks.size, dtype=bool)
        t_lo[blocks] = self._time_s(np.fmin.reduce(self.per_layer_s, axis=2)[key, size], group, size, ok)
        least = replace(self, act_policy_bytes=self.act_policy_bytes.min(axis=2, keepdims=True),
                        act_extra_bytes=self.act_extra_bytes.min(axis=2, keepdims=True))
        m_lo[blocks] = least._memory_bytes(group, size, ok)[:, 0]
        return t_lo.reshape(g_n, s_n), m_lo.reshape(g_n, s_n)


@dataclass(frozen=True)
class PairTerms:
    """The terms of :class:`GroupBounds`' time bound, with the schedule's part per schedule and
    virtual-stage count (``space._schedule_pairs``' pairs) instead of the least over them: the
    cell's configurations of one pair take at least (m + bubble of the pair) t_mb, t_mb at the
    pair's fewest first-rank layers (Narayanan et al. 2021 Sec. 2.2, as the cell's bound, which is
    the least of these over the pairs). Arrays per group are indexed by the groups'
    ``group_bounds`` saw."""

    key_of: np.ndarray  # (groups,) row of per_layer_s
    per_layer_s: np.ndarray  # (keys, sizes, choices) a layer's time under each recompute choice
    pp_of: np.ndarray  # (groups,) row of fewest_layers / bubble
    fewest_layers: np.ndarray  # (pipeline degrees, pairs) first-rank layers (inf: pair illegal)
    bubble: np.ndarray  # (pipeline degrees, pairs) the bubble's factor (inf: pair illegal)
    micro_batches: np.ndarray  # (groups, sizes) m
    tail_s: np.ndarray  # (groups,)
    overhead_s: float  # per micro-batch
    above_cell: np.ndarray  # (pipeline degrees, pairs) whether the pair's fewest layers or bubble exceed the cell's

    def time_s(self, group: np.ndarray, pair: np.ndarray, size: np.ndarray) -> np.ndarray:
        """(rows, choices): the time bound of each row's (group, pair, size index), the cell
        bound's operations in its order (each operand at least the cell's: never below it)."""
        at = self.pp_of[group]
        t = take_rows(self.per_layer_s, self.key_of[group], size)
        t *= take_rows(self.fewest_layers, at, pair)[:, None]
        t += self.overhead_s
        t *= (take_rows(self.micro_batches, group, size) + take_rows(self.bubble, at, pair))[:, None]
        t += self.tail_s[group][:, None]
        return t


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
    # (below the configurations' own bound, the mean rank of even.balanced_slice: L / p layers,
    # never more than the first rank's, and no embedding with a pipeline)
    fewest = np.minimum(layers0.min(axis=1), model.num_layers / pps)[at]
    least_bubble = bubble.min(axis=1)[at]

    # Per micro-batch: every size dividing the global batch that divides the group's replica
    # batch (a superset of the legal ones), with each module set searched. The layer's time and
    # activations depend on the group through the layer-key columns only, and on ZeRO's columns
    # only through the layer's states (read from the probe below, not from this table), the
    # host's FSDP kernels (ZeRO-2/3 over more than one rank, which every group with ZeRO > 0 has:
    # ``cost.host.layer_kernels``) and the runtime's per-layer FSDP overhead (ZeRO-2/3,
    # (dp_shard cp - 1) x fsdp_layer_overhead_s >= 0: ``cost.layer.framework_overhead_s``). So
    # ZeRO-1 counts as ZeRO-0 (it shards the optimizer states only), and the table is computed
    # for the group of least dp_shard (exact when that overhead is 0, the default; below it
    # otherwise), once per distinct other key columns, size and module set, and read by every
    # group that shares them. Packed documents' attention depends on dp: then dp_shard stays in
    # the key.
    packed = training.seq_len_dist is not None
    key_cols = [k for k in LAYER_KEY_FIELDS if k in GROUP_COLUMNS and (packed or k != "dp_shard")]
    key = np.zeros(g, dtype=np.int64)
    for k in key_cols:
        col = groups[k].astype(np.int64)
        if k == "zero":
            col = np.maximum(col, 1)  # ZeRO-0 and ZeRO-1 share one key
        key = key * (int(col.max(initial=0)) + 1) + col
    by_shard = np.argsort(groups["dp_shard"], kind="stable")  # each key's first group: its least dp_shard
    _, first_of, key_of = np.unique(key[by_shard], return_index=True, return_inverse=True)
    first_of, key_of = by_shard[first_of], key_of.reshape(-1)[np.argsort(by_shard)]
    sizes = micro_batch_sizes(training)
    codes = np.concatenate(([0], module_codes(model, options))).astype(np.int64)
    k_n, s_n, c_n = first_of.size, sizes.size, codes.size
    dp = groups["dp_replicate"] * groups["dp_shard"]
    per_dp = training.global_batch // dp
    legal_mb = per_dp[:, None] % sizes[None, :] == 0  # (groups, sizes)
    used = np.zeros((k_n, s_n), dtype=bool)  # (key, size) pairs some group can run
    np.logical_or.at(used, key_of, legal_mb)
    ks, si = np.nonzero(used)
    ki, mb = first_of[ks], sizes[si]
    selective = RECOMPUTES.index(Recompute.SELECTIVE)
    rows = _columns(take_groups(groups, ki), ki.size,
                    {"schedule": np.full(ki.size, int(sched[0])), "vpp": np.ones(ki.size, dtype=np.int64),
                     "micro_batch": mb, "recompute": np.full(ki.size, RC_NONE)})
    # (the bound reads the average layer only; every module set's selective fields at once, each
    # row costed once: layer_cost's module_codes. The rows are distinct: no sharing to find.)
    u = layer_cost_in_slices(ctx, rows, module_codes=codes)
    # Per recompute choice v (policy, module set): the layer's time with its recompute, its
    # activations under the policy and without recompute (cost.plan_terms: rec_one, act_policy).
    policy, module = recompute_variants(model, options)
    col = np.searchsorted(codes, module)  # the module set's column of the layer table

    def table(values: np.ndarray) -> np.ndarray:  # (key, size[, module set]) -> (key, size, choice)
        out = np.zeros((k_n, s_n, c_n))
        out[ks, si] = np.broadcast_to(values.reshape(ks.size, -1), (ks.size, c_n))
        return out[:, :, col]

    rec_one = np.where(policy == RC_FULL, table(u.recompute_full_s),
                       np.where(policy == selective, table(u.recompute_selective_s), 0.0))
    act_none = table(u.act_none_bytes)
    act_policy = np.where(policy == RC_FULL, table(u.act_full_bytes),
                          np.where(policy == selective, table(u.act_selective_bytes), act_none))
    per_layer = np.ascontiguousarray(  # (one copy for both: PairTerms reads it by flat rows, cell_survivors.take_rows)
        table(u.fwd_compute_s + u.bwd_compute_s + u.fwd_comm_exposed_s + u.bwd_comm_exposed_s) + rec_one)

    # States and optimizer step: one probe per group (the first listed schedule with one chunk,
    # micro-batch 1, no recompute: none of them changes these), at the fewest layers.
    base = {"schedule": np.full(g, int(sched[0])), "vpp": np.ones(g, dtype=np.int64),
            "micro_batch": np.ones(g, dtype=np.int64), "recompute": np.full(g, RC_NONE)}
    probe = _columns(groups, g, base)
    layer = shared_layer_cost(ctx, probe, with_stack=False).take(slice(None))  # the group's own states
    first = rank_cost(model, ctx.cluster, training, probe, calib, layer, rank=0, layers=fewest, recomputed=0,
                      has_embedding=groups["pp"] == 1, has_head=groups["pp"] == 1, totals=False)
    states = first.parameters_bytes + first.gradients_bytes + first.optimizer_bytes
    # Of the rest (cost.memory.rank_other): the communication buckets, the framework's overhead,
    # ZeRO-3's gathered layers (depend on no crossed choice but the zero-bubble schedule's, which
    # keeps more), the allocator's reserve on the states alone (none held under expandable
    # segments) and what lies outside the allocator: the device peak "fits" reads
    # (cost.device_memory.fit_bytes).
    reserve = 1.0 + held_fragmentation(calib)
    memory = (states * reserve + first.gathered_weight_bytes + calib.comm_bucket_bytes
              + calib.framework_overhead_gib * GIB + outside_allocator_bytes(probe, calib))
    tail = first.optimizer_s

    # The cells (groups x sizes x choices: DeepSeek-V3 on 1024 GB200, 24M) are left as these
    # factors; GroupBounds.cells computes the blocks read.
    m = np.where(legal_mb, per_dp[:, None] // sizes[None, :], 0).astype(float)
    held = np.minimum(groups["pp"][:, None].astype(float), m)
    pair_fewest = np.minimum(layers0, (model.num_layers / pps)[:, None])
    cell_fewest = np.minimum(layers0.min(axis=1), model.num_layers / pps)[:, None]
    pair = PairTerms(key_of=key_of, per_layer_s=per_layer, pp_of=np.searchsorted(pps, groups["pp"]),
                     fewest_layers=pair_fewest, bubble=bubble, micro_batches=m, tail_s=tail,
                     overhead_s=calib.microbatch_overhead_s,
                     above_cell=(pair_fewest > cell_fewest) | (bubble > bubble.min(axis=1)[:, None]))
    return GroupBounds(key_of=key_of, per_layer_s=per_layer,
                       act_policy_bytes=np.ascontiguousarray(act_policy),
                       act_extra_bytes=np.ascontiguousarray(np.where(policy != RC_NONE, act_none - act_policy, 0.0)),
                       fewest_layers=fewest, cycles=m + least_bubble[:, None], held_layers=held * fewest[:, None],
                       tail_s=tail, fixed_bytes=memory, legal=legal_mb, overhead_s=calib.microbatch_overhead_s,
                       reserve=reserve, pair=pair)


def prune_groups(ctx: CostContext, groups: dict[str, np.ndarray], options: SearchOptions, *,
                 shrink: float, budget_bytes: float) -> tuple[CellKeep, int]:
    """:func:`surviving` with each seed group's configurations scored by the even pass (itself
    pruned, :func:`meshplan.search.even.even_estimate`): the cells to cross
    (``space.cross_groups``'s ``keep``) and the configurations scored."""
    from meshplan.search.even import even_estimate

    def score(seed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        plans = cross_groups(seed, ctx.model, ctx.training, options)
        est, _ = even_estimate(ctx, plans, shared_layer_cost(ctx, plans), prune_shrink=shrink,
                               budget_bytes=budget_bytes)
        return est.step_time_s[est.exact], est.peak_memory_bytes[est.exact]

    return surviving(groups, group_bounds(ctx, groups, options), score, shrink=shrink, budget_bytes=budget_bytes)
