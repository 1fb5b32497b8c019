"""Groups dropped before they are crossed (``meshplan.search.group_prune``): the group bound is
below the first-rank bound of every configuration of the group, and a search that drops groups
returns the frontier of the search that scores every configuration in full; so does the bound of
a cell's configurations of one schedule and virtual-stage count (``PairTerms``)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost.calibration import calibration_for
from meshplan.plan import RecomputeModule, Schedule
from meshplan.search import planner
from meshplan.search.even import balanced_slice, even_slice
from meshplan.search.group_prune import group_bounds
from meshplan.search.planner import search
from meshplan.search.space import (GROUP_COLUMNS, SearchOptions, _schedule_pairs, configurations_per_group,
                                   cross_groups, enumerate_groups, enumerate_space, micro_batch_sizes,
                                   recompute_variants, take_groups)
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.model import ModelSpec, Position
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODULE_SETS = ((RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),
               (RecomputeModule.CORE_ATTN, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM))


def _group_of(space, groups) -> np.ndarray:
    """Index into ``groups`` of each configuration of ``space``."""
    g = np.column_stack([np.asarray(groups[k]).astype(np.int64) for k in GROUP_COLUMNS])
    s = np.column_stack([np.asarray(getattr(space, k)).astype(np.int64) for k in GROUP_COLUMNS])
    _, inverse = np.unique(np.concatenate([g, s]), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    of_code = np.full(inverse.max() + 1, -1)
    of_code[inverse[:len(g)]] = np.arange(len(g))
    out = of_code[inverse[len(g):]]
    assert np.all(out >= 0)
    return out


def _cell_of(space, groups, model, training, options) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, micro-batch size, recompute choice) index of each configuration of ``space``."""
    policy, module = recompute_variants(model, options)
    choice = np.full(len(space), -1)
    for v, (p, mod) in enumerate(zip(policy, module)):
        choice[(space.recompute == p) & (space.recompute_modules == mod)] = v
    assert np.all(choice >= 0)
    return (_group_of(space, groups), np.searchsorted(micro_batch_sizes(training), space.micro_batch), choice)


@st.composite
def jobs(draw):
    heads = draw(st.sampled_from([8, 16, 32]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    moe = draw(st.booleans())
    model = ModelSpec(
        name="rand", num_layers=draw(st.integers(2, 24)), hidden_size=hidden, num_heads=heads,
        num_kv_heads=draw(st.sampled_from([heads, heads // 4])), ffn_hidden_size=4 * hidden,
        gated_mlp=draw(st.booleans()), vocab_size=draw(st.sampled_from([32000, 128256])), position=Position.ROPE,
        **(dict(moe_num_experts=draw(st.sampled_from([8, 16])), moe_top_k=2,
                moe_ffn_hidden_size=draw(st.sampled_from([hidden, 2 * hidden]))) if moe else {}))
    gpu = draw(st.sampled_from(["h100-sxm", "a100-40gb", "gb200"]))
    cluster = cluster_for_gpu(gpu, gpus_per_node=8 if gpu != "gb200" else 4).with_gpus(
        draw(st.sampled_from([4, 8, 16, 32])))
    training = TrainingSpec(seq_len=draw(st.sampled_from([1024, 4096, 32768])),
                            global_batch=draw(st.sampled_from([8, 32, 128])))
    schedules = draw(st.sampled_from([SearchOptions().schedules, tuple(Schedule)]))
    options = SearchOptions(schedules=schedules, recompute_module_sets=MODULE_SETS if moe else ())
    return model, cluster, training, options


def _crossed(job):
    """A drawn job's cost context, groups, crossed space and group bounds (None: an empty space)."""
    model, cluster, training, options = job
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    groups = enumerate_groups(model, training, cluster.num_gpus, options)
    space = cross_groups(groups, model, training, options)
    if len(space) == 0:
        return None
    return ctx, groups, space, group_bounds(ctx, groups, options)


@settings(max_examples=15, deadline=None)
@given(jobs())
def test_group_bound_is_below_every_configuration_of_the_group(job):
    model, cluster, training, options = job
    crossed = _crossed(job)
    if crossed is None:
        return
    ctx, groups, space, bound = crossed
    first = even_slice(ctx, space, shared_layer_cost(ctx, space).take(slice(None)), first_only=True)
    cell = _cell_of(space, groups, model, training, options)
    tol = 1 - 1e-12
    assert np.all(bound.time_s[cell] <= first.step_time_s / tol)
    assert np.all(bound.memory_bytes[cell] <= first.peak_memory_bytes / tol)
    assert np.all(bound.time_s > 0) and np.all(bound.memory_bytes > 0)


@settings(max_examples=15, deadline=None)
@given(jobs())
def test_pair_bound_is_below_every_configuration_of_its_schedule_and_above_the_cell(job):
    # CellKeep drops the configurations of a kept cell whose schedule / virtual-stage pair's own
    # bound is beaten: that bound must hold for each configuration of the pair (the first rank's
    # bound; the mean rank's, which the even pass prunes on, where the model has one)
    model, cluster, training, options = job
    crossed = _crossed(job)
    if crossed is None:
        return
    ctx, groups, space, bound = crossed
    layer = shared_layer_cost(ctx, space).take(slice(None))
    first = even_slice(ctx, space, layer, first_only=True)
    mean = balanced_slice(ctx, space, layer)
    g, size, choice = _cell_of(space, groups, model, training, options)
    sched, vpp = _schedule_pairs(options, model)
    pair = np.full(len(space), -1)
    for j, (s_code, v) in enumerate(zip(sched, vpp)):
        pair[(space.schedule == s_code) & (space.vpp == v)] = j
    assert np.all(pair >= 0)
    t = bound.pair.time_s(g, pair, size)[np.arange(len(space)), choice]
    tol = 1 - 1e-12
    assert np.all(t <= first.step_time_s / tol)
    assert np.all(t <= mean.step_time_s / tol)
    assert np.all(t >= bound.time_s[g, size, choice])


def test_group_bound_is_close_on_one_node():
    # the bound leaves out the embedding, the exposed ZeRO/p2p communication, the logits and
    # the schedule's extra in-flight micro-batches only
    model = model_preset("mixtral-8x7b")
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(8)
    training = TrainingSpec(seq_len=4096, global_batch=8)
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    groups = enumerate_groups(model, training, 8)
    bound = group_bounds(ctx, groups, SearchOptions())
    space = cross_groups(groups, model, training)
    first = even_slice(ctx, space, shared_layer_cost(ctx, space).take(slice(None)), first_only=True)
    cell = _cell_of(space, groups, model, training, SearchOptions())
    best_t, best_m = np.full(bound.time_s.shape, np.inf), np.full(bound.time_s.shape, np.inf)
    np.minimum.at(best_t, cell, first.step_time_s)
    np.minimum.at(best_m, cell, first.peak_memory_bytes)
    ok = np.isfinite(best_t)
    assert np.median(bound.time_s[ok] / best_t[ok]) > 0.8 and np.median(bound.memory_bytes[ok] / best_m[ok]) > 0.8


def test_crossing_a_subset_of_groups_keeps_the_space_order():
    model = model_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    options = SearchOptions(recompute_module_sets=MODULE_SETS)
    groups = enumerate_groups(model, training, 32, options)
    space = enumerate_space(model, training, 32, options)
    assert configurations_per_group(groups, model, training, options).sum() == len(space)
    rng = np.random.default_rng(3)
    keep = rng.random(groups["pp"].size) < 0.3
    cells = rng.random((int(keep.sum()), micro_batch_sizes(training).size,
                        recompute_variants(model, options)[0].size)) < 0.5
    sub = cross_groups(take_groups(groups, keep), model, training, options, keep=cells)
    g, size, choice = _cell_of(space, groups, model, training, options)
    sub_index = np.cumsum(keep) - 1
    rows = np.flatnonzero(keep[g] & cells[sub_index[g], size, choice])
    for name in ("pp", "tp", "ep", "etp", "zero", "schedule", "vpp", "micro_batch", "recompute", "recompute_modules"):
        assert np.array_equal(getattr(sub, name), getattr(space, name)[rows]), name
    whole = cross_groups(take_groups(groups, keep), model, training, options)
    assert configurations_per_group(take_groups(groups, keep), model, training, options).sum() == len(whole)


def _frontier(res):
    return [(p.step_time_s, p.peak_memory_bytes, p.plan) for p in res.frontier]


def _same_search(model, cluster, training, options, monkeypatch):
    monkeypatch.setattr(planner, "GROUP_PRUNE_MIN_CONFIGS", 0)  # drop groups on small spaces too
    grouped = search(model, cluster, training, options=options, prune=True)
    full = search(model, cluster, training, options=options, prune=False)
    assert _frontier(grouped) == _frontier(full)
    assert grouped.recommended == full.recommended
    assert grouped.global_configs == full.global_configs
    return grouped


@settings(max_examples=15, deadline=None)
@given(jobs())
def test_search_dropping_groups_equals_full_search(job):
    with pytest.MonkeyPatch.context() as mp:
        _same_search(*job, mp)


def test_search_dropping_groups_equals_full_search_on_mixtral(monkeypatch):
    res = _same_search(model_preset("mixtral-8x7b"), cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(64),
                       TrainingSpec(seq_len=4096, global_batch=256),
                       SearchOptions(recompute_module_sets=MODULE_SETS), monkeypatch)
    assert res.pruned_configs > 0.5 * res.global_configs


def test_group_bound_is_below_every_configuration_with_an_fsdp_layer_overhead():
    # the bound's layer table is computed for each key's group of least dp_shard: with a
    # per-layer FSDP overhead ((dp_shard cp - 1) x fsdp_layer_overhead_s) it is below the
    # groups that shard over more ranks, never above
    model = model_preset("mixtral-8x7b")
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(32)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    options = SearchOptions(recompute_module_sets=MODULE_SETS)
    calib = calibration_for(cluster.gpu).replace_fields(fsdp_layer_overhead_s=2e-4)
    ctx = CostContext(model, cluster, training, calib)
    groups = enumerate_groups(model, training, cluster.num_gpus, options)
    assert np.unique(groups["dp_shard"][groups["zero"] >= 2]).size > 2
    space = cross_groups(groups, model, training, options)
    bound = group_bounds(ctx, groups, options)
    first = even_slice(ctx, space, shared_layer_cost(ctx, space).take(slice(None)), first_only=True)
    cell = _cell_of(space, groups, model, training, options)
    tol = 1 - 1e-12
    assert np.all(bound.time_s[cell] <= first.step_time_s / tol)
    assert np.all(bound.memory_bytes[cell] <= first.peak_memory_bytes / tol)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3"])
def test_layer_time_and_activations_ignore_what_the_bound_table_leaves_out(name):
    # group_bounds computes its layer table once per key without dp_shard and with ZeRO-0 and
    # ZeRO-1 as one, from the key's group of least dp_shard: exact only while the layer's time
    # and activations (not its states) are the same across those (no FSDP layer overhead)
    from dataclasses import fields, replace

    from meshplan.cost.layer import LayerCost, layer_cost

    model = model_preset(name)
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(256)
    training = TrainingSpec(seq_len=4096, global_batch=1024)
    options = SearchOptions(recompute_module_sets=MODULE_SETS)
    groups = enumerate_groups(model, training, cluster.num_gpus, options)
    plans = cross_groups(take_groups(groups, np.random.default_rng(5).random(groups["pp"].size) < 0.02),
                         model, training, options)
    plans = plans.take(np.flatnonzero((plans.zero >= 1) & (plans.dp_shard > 1)))
    assert len(plans) > 100
    other = replace(plans, dp_shard=np.where(plans.dp_shard > 2, plans.dp_shard // 2, plans.dp_shard * 2))
    zero1 = plans.take(np.flatnonzero(plans.zero == 1))
    assert len(zero1) > 10
    calib = calibration_for(cluster.gpu)
    a, b = (layer_cost(model, cluster, training, p, calib) for p in (plans, other))
    c, d = (layer_cost(model, cluster, training, p, calib)
            for p in (zero1, replace(zero1, zero=np.zeros(len(zero1), dtype=np.int64))))
    read = [f.name for f in fields(LayerCost) if f.name not in ("state_bytes", "params_per_gpu",
                                                                "dense_params_per_gpu")]
    for f in read:
        for x, y, n in ((a, b, len(plans)), (c, d, len(zero1))):
            assert np.array_equal(np.broadcast_to(getattr(x, f), (n,)), np.broadcast_to(getattr(y, f), (n,))), f


def test_search_dropping_groups_under_an_allow_mask_equals_full_search(monkeypatch):
    # a caller's allow (the Megatron space: no ZeRO-2, ZeRO-3 only without replicas or a pipeline)
    # prunes cells too: only plans it allows seed the pruning (session 11; before, no cell was
    # dropped under a mask and DeepSeek-V3 / 256 for --target megatron took 28.8 s)
    from meshplan.cost.arrays import PlanArrays
    from meshplan.export.common import search_options_for

    options = search_options_for("megatron")
    res = _same_search(model_preset("mixtral-8x7b"), cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(64),
                       TrainingSpec(seq_len=4096, global_batch=256), options, monkeypatch)
    assert res.pruned_configs > 0.5 * res.global_configs
    assert all(options.allow(PlanArrays.from_plans([p.plan])).all() for p in res.frontier)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), max_size=12),
       st.lists(st.tuples(st.integers(1, 14), st.integers(1, 14)), min_size=1, max_size=40),
       st.sampled_from([1.0, 1 / 1.1, 0.5]), st.sampled_from([0.0, 3.0, np.inf]))
def test_beaten_at_is_prunable(front, queries, shrink, fastest):
    # CellKeep.mask decides with one frontier lookup per cell (beaten_at_s) what prunable decides
    # per configuration; small integers so that times and memories tie with the frontier's
    from meshplan.search.frontier import Front
    from meshplan.search.group_prune import beaten_at_s
    from meshplan.search.prune import STRICT, prunable

    known = Front.of(np.array([f[0] for f in front], dtype=float), np.array([f[1] for f in front], dtype=float),
                     np.arange(len(front))) if front else Front.empty()
    # (shrunk, some land exactly on a frontier time or memory)
    t = np.array([q[0] for q in queries], dtype=float) / STRICT / shrink
    m = np.array([q[1] for q in queries], dtype=float) / STRICT / shrink
    want = prunable(known, t, m, shrink=shrink, fastest_fitting_s=fastest)
    got = (t * shrink * STRICT >= beaten_at_s(known, m, shrink)) & (t >= fastest)
    assert np.array_equal(got, want)


@pytest.mark.xfail(strict=True, reason="known, found by the fuzz above at session 13's final CI and present since "
                   "db5cf48 (not group pruning: it persists with GROUP_PRUNE_MIN_CONFIGS above the space): the pruned "
                   "search misses zero1 full:2 at 5.5667 ms / 8.380 GiB between two points it keeps (5.3767 ms / "
                   "8.409 GiB, 5.5717 ms / 7.807 GiB); to fix in the stage walk's pruned path")
def test_pruned_search_keeps_a_near_tie_recompute_point(monkeypatch):
    model = ModelSpec(name="rand", num_layers=13, hidden_size=512, num_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
                      gated_mlp=False, vocab_size=128256, position=Position.ROPE)
    cluster = cluster_for_gpu("gb200", gpus_per_node=4).with_gpus(16)
    _same_search(model, cluster, TrainingSpec(seq_len=1024, global_batch=32), SearchOptions(), monkeypatch)
