"""Hypothesis properties of the cost model: monotone memory, non-negative times, DP scaling."""

from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import assume, given, settings, strategies as st

from meshplan.cost import estimate
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODELS = [model_preset("llama3-8b"), model_preset("gpt3-1.3b"), model_preset("mixtral-8x7b")]

base_plans = st.builds(
    lambda m, tp, pp, dp, mb, rec, sp, seq: (m, tp, pp, dp, mb, rec, sp, seq),
    st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from(list(Recompute)),
    st.booleans(), st.sampled_from([1024, 4096]),
)


def _est(model, plan, seq, gb):
    cl = system_preset("dgx-h100").with_gpus(plan.dims.world_size)
    tr = TrainingSpec(seq_len=seq, global_batch=gb)
    try:
        return estimate(model, cl, tr, plan)
    except MeshplanError:
        assume(False)


def _plan(tp, pp, dp, mb, rec, sp, zero=1, shard=None):
    shard = dp if shard is None else shard
    return Plan(dims=ParallelDims(dp_replicate=dp // shard, dp_shard=shard, tp=tp, pp=pp),
                zero=zero if shard > 1 or zero else 0, sp=sp and tp > 1, micro_batch=mb, recompute=rec)


@settings(max_examples=30, deadline=None)
@given(base_plans, st.sampled_from([0, 1, 2]))
def test_higher_zero_stage_never_raises_memory(case, zero):
    m, tp, pp, dp, mb, rec, sp, seq = case
    assume(dp > 1)
    gb = 8 * dp * mb
    lo = _est(m, _plan(tp, pp, dp, mb, rec, sp, zero=zero, shard=dp if zero else 1), seq, gb)
    hi = _est(m, _plan(tp, pp, dp, mb, rec, sp, zero=zero + 1, shard=dp), seq, gb)
    assert hi.peak_memory_gib <= lo.peak_memory_gib * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(base_plans, st.sampled_from([1, 2, 3]))
def test_more_dp_shard_never_raises_memory(case, zero):
    m, tp, pp, dp, mb, rec, sp, seq = case
    assume(dp * 2 * tp * pp <= 64)
    gb = 16 * dp * mb
    lo = _est(m, _plan(tp, pp, dp, mb, rec, sp, zero=zero), seq, gb)
    hi = _est(m, _plan(tp, pp, 2 * dp, mb, rec, sp, zero=zero), seq, gb)
    assert hi.peak_memory_gib <= lo.peak_memory_gib * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(base_plans)
def test_more_recompute_never_raises_memory(case):
    m, tp, pp, dp, mb, _, sp, seq = case
    gb = 4 * dp * mb
    mems = [_est(m, _plan(tp, pp, dp, mb, r, sp), seq, gb).peak_memory_gib
            for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)]
    assert mems[0] >= mems[1] * (1 - 1e-9) and mems[1] >= mems[2] * (1 - 1e-9)


@settings(max_examples=30, deadline=None)
@given(base_plans, st.sampled_from(list(Schedule)))
def test_all_times_are_non_negative(case, sched):
    m, tp, pp, dp, mb, rec, sp, seq = case
    vpp = 2 if sched in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE) and pp > 1 else 1
    assume(pp > 1 or sched == Schedule.ONE_F_ONE_B)
    plan = replace(_plan(tp, pp, dp, mb, rec, sp), schedule=sched, vpp=vpp)
    e = _est(m, plan, seq, 4 * pp * dp * mb)
    for f in fields(e.time):
        assert getattr(e.time, f.name) >= 0, f.name
    assert e.step_time_s > 0 and e.tokens_per_s > 0 and 0 < e.mfu < 1
    for s in e.stages:
        assert s.microbatch_time_s > 0
        for f in fields(s.memory):
            assert getattr(s.memory, f.name) >= 0


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from([(1, 2), (2, 4), (4, 8), (16, 32), (64, 128)]),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 4]), st.sampled_from([1024, 4096]),
       st.sampled_from([0, 1, 3]))
def test_doubling_gpus_with_pure_dp_never_lowers_throughput(model, ns, mb, accum, seq, zero):
    # Fixed per-GPU batch (mb x accum sequences). Both counts lie in the same network tier
    # (inside one 8-GPU node, or spanning nodes): crossing from NVLink to the NIC is the one
    # place where a real cluster can lose throughput, and the model says so.
    n, n2 = ns
    assume(model.position.value != "learned" or seq <= model.max_position)
    out = []
    for k in (n, n2):
        plan = Plan(dims=ParallelDims(dp_replicate=1 if zero else k, dp_shard=k if zero else 1),
                    zero=zero if k > 1 else 0, micro_batch=mb, recompute=Recompute.FULL)
        cl = system_preset("dgx-h100").with_gpus(k)
        e = estimate(model, cl, TrainingSpec(seq_len=seq, global_batch=k * mb * accum), plan)
        out.append(e.tokens_per_s)
    assert out[1] >= out[0] * (1 - 1e-9)
