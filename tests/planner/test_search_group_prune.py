"""Groups dropped before they are crossed (``meshplan.search.group_prune``): the group bound is
below the first-rank bound of every configuration of the group, and a search that drops groups
returns the frontier of the search that scores every configuration in full."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost.calibration import calibration_for
from meshplan.plan import RecomputeModule, Schedule
from meshplan.search import planner
from meshplan.search.even import even_slice
from meshplan.search.group_prune import group_bounds
from meshplan.search.planner import search
from meshplan.search.space import (GROUP_COLUMNS, SearchOptions, configurations_per_group, cross_groups,
                                   enumerate_groups, enumerate_space, take_groups)
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


@settings(max_examples=20, deadline=None)
@given(jobs())
def test_group_bound_is_below_every_configuration_of_the_group(job):
    model, cluster, training, options = job
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    groups = enumerate_groups(model, training, cluster.num_gpus, options)
    space = cross_groups(groups, model, training, options)
    if len(space) == 0:
        return
    bound = group_bounds(ctx, groups, options)
    first = even_slice(ctx, space, shared_layer_cost(ctx, space).take(slice(None)), first_only=True)
    g = _group_of(space, groups)
    tol = 1 - 1e-12
    assert np.all(bound.time_s[g] <= first.step_time_s / tol)
    assert np.all(bound.memory_bytes[g] <= first.peak_memory_bytes / tol)
    assert np.all(bound.time_s > 0) and np.all(bound.memory_bytes > 0)


def test_group_bound_is_close_where_one_configuration_is_the_group():
    # pp 1, one micro-batch size, no recompute: the bound leaves out the embedding, the exposed
    # ZeRO/p2p communication and the activations only.
    model = model_preset("mixtral-8x7b")
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(8)
    training = TrainingSpec(seq_len=4096, global_batch=8)
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    groups = enumerate_groups(model, training, 8)
    bound = group_bounds(ctx, groups, SearchOptions())
    space = cross_groups(groups, model, training)
    first = even_slice(ctx, space, shared_layer_cost(ctx, space).take(slice(None)), first_only=True)
    g = _group_of(space, groups)
    best_t = np.full(bound.time_s.size, np.inf)
    np.minimum.at(best_t, g, first.step_time_s)
    assert np.median(bound.time_s / best_t) > 0.8


def test_crossing_a_subset_of_groups_keeps_the_space_order():
    model = model_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    options = SearchOptions(recompute_module_sets=MODULE_SETS)
    groups = enumerate_groups(model, training, 32, options)
    space = enumerate_space(model, training, 32, options)
    assert configurations_per_group(groups, model, training, options).sum() == len(space)
    keep = np.random.default_rng(3).random(groups["pp"].size) < 0.3
    sub = cross_groups(take_groups(groups, keep), model, training, options)
    rows = np.flatnonzero(keep[_group_of(space, groups)])
    for name in ("pp", "tp", "ep", "etp", "zero", "schedule", "vpp", "micro_batch", "recompute", "recompute_modules"):
        assert np.array_equal(getattr(sub, name), getattr(space, name)[rows]), name
    counts = configurations_per_group(take_groups(groups, keep), model, training, options)
    assert counts.sum() == len(sub)


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
