"""Counted activation offload (Megatron's ``cpu_offloading_num_layers``, ``SearchOptions.offload_layer_counts``):
on small spaces the search's fastest plan that fits equals brute force over every configuration,
offload choice and count of offloaded layers, each scored by ``meshplan.cost.estimate``; the
bisection equals a scan of every count; the meshplan target refuses counts in its mask."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost import estimate
from meshplan.cost.offload import host_budget_bytes
from meshplan.plan import Offload, ParallelDims, Plan, Recompute
from meshplan.search.offload import fewest_fitting_counts, maximal_per_row
from meshplan.search.planner import search
from meshplan.search.space import enumerate_space
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target, search_options, why_not

GIB = 2**30


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.integers(1, 40), st.integers(0, 1000))
def test_bisection_equals_scanning_every_count(slopes, most, budget):
    """Any peak that does not grow with the count: the fewest fitting count is the first of a scan."""
    n = len(slopes)
    start = np.array([s * most + budget for s in slopes], dtype=float)  # fits at ``most`` (peak = budget)
    slope = np.array(slopes, dtype=float)

    def peak(idx, counts):
        return start[idx] - slope[idx] * counts

    got = fewest_fitting_counts(np.zeros(n), most, float(budget), peak)
    for i in range(n):
        want = next(c for c in range(1, most + 1) if peak(np.array([i]), np.array([c]))[0] <= budget)
        assert got[i] == want


def test_maximal_per_row_keeps_the_widest_allowed_choice():
    src = np.array([0, 0, 0, 1, 1])
    code = np.array([1, 4, 5, 1, 4])  # row 0: opt, act, opt+act; row 1 (opt+act refused): opt, act
    assert maximal_per_row(src, code).tolist() == [2, 3, 4]


def _case(layers: int, gpus: int, seq: int):
    model = ModelSpec(name="rand", num_layers=layers, hidden_size=1024, num_heads=8, num_kv_heads=8,
                      ffn_hidden_size=4096, gated_mlp=True, vocab_size=32000, position="rope")
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=gpus).with_gpus(gpus)
    return model, cluster, TrainingSpec(seq_len=seq, global_batch=8)


def _offload_brute_force(model, cluster, training, options, budget):
    """Fastest (time, plan) over every configuration x offload choice with activations x count."""
    space = enumerate_space(model, training, cluster.num_gpus, replace(options, allow=None))
    best = (np.inf, None)
    for i in range(len(space)):
        base = space.plan(i)
        if base.dims.pp != 1 or base.recompute != Recompute.NONE:
            continue  # Megatron's activation offload needs both (export.megatron)
        for choice in options.offloads:
            if Offload.ACTIVATIONS not in choice:
                continue
            for n in range(1, model.num_layers):
                plan = replace(base, offload=choice, offload_layers=n)
                if why_not(Target.MEGATRON, model, training, plan) is not None or (
                        not options.allow(type(space).from_plans([plan]))[0]):
                    continue
                e = estimate(model, cluster, training, plan)
                if (e.fit_memory_gib * GIB <= budget and e.host_memory_gib * GIB <= host_budget_bytes(cluster)
                        and e.step_time_s < best[0]):
                    best = (e.step_time_s, plan)
    return best


@pytest.mark.parametrize("layers,gpus,seq,budget_gib,wins", [
    (8, 4, 16384, 6.5, True),  # nothing fits without offload: a counted offload is the plan
    (8, 4, 16384, 13.6, False), (6, 2, 8192, 20.9, False)])  # H100's host link: cp / sharding win
def test_search_reaches_the_fastest_counted_offload(layers, gpus, seq, budget_gib, wins):
    """The search's fastest plan that fits = the faster of brute force over every count and the
    search without offload (no recompute: Megatron offloads activations only without it)."""
    model, cluster, training = _case(layers, gpus, seq)
    options = search_options(Target.MEGATRON, model, training)
    assert not options.offload_layer_counts and (Offload.ACTIVATIONS,) not in options.offloads  # off by default
    act, opt = Offload.ACTIVATIONS, Offload.OPTIMIZER
    options = replace(options, recomputes=(Recompute.NONE,), offload_layer_counts=True,
                      offloads=((opt,), (act,), (opt, act)))  # the mechanism, turned on
    budget = budget_gib * GIB
    bf_time, bf_plan = _offload_brute_force(model, cluster, training, options, budget)
    plain = search(model, cluster, training, budget_bytes=budget, options=replace(options, offloads=()))
    res = search(model, cluster, training, budget_bytes=budget, options=options)
    plain_s = plain.recommended.step_time_s if plain.recommended else np.inf
    assert bf_plan is not None and (bf_time < plain_s) == wins
    assert res.recommended.step_time_s == pytest.approx(min(bf_time, plain_s), rel=1e-9)
    assert bool(res.recommended.plan.offload_layers) == wins
    for pt in res.frontier:
        if pt.plan.offload_layers:  # the search's counts: the fewest that fit, or the most (the floor)
            assert 0 < pt.plan.offload_layers < model.num_layers
            assert why_not(Target.MEGATRON, model, training, pt.plan) is None
            fewer = replace(pt.plan, offload_layers=pt.plan.offload_layers - 1)
            fits = (pt.plan.offload_layers == 1
                    or estimate(model, cluster, training, fewer).fit_memory_gib * GIB > budget
                    or pt.peak_memory_bytes > budget)
            assert fits or pt.plan.offload_layers == model.num_layers - 1


def test_meshplan_target_refuses_counts_in_its_mask():
    model, cluster, training = _case(4, 2, 4096)
    plan = Plan(dims=ParallelDims(dp_shard=2), zero=3, offload=(Offload.ACTIVATIONS,), offload_layers=2)
    opts = search_options(Target.MESHPLAN, model, training)
    from meshplan.cost.arrays import PlanArrays

    assert not opts.allow(PlanArrays.from_plans([plan]))[0]
    assert "offload_layers=2" in why_not(Target.MESHPLAN, model, training, plan)
    assert not opts.offload_layer_counts
