"""OSDP (issue 17.2): groups kept gathered and operators split, by hand in the cost model, as plan
rules, notation and flags, in the search and in the exporters."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cli.plan_flags import build_plan, flags_for
from meshplan.cost import comms, estimate
from meshplan.cost.calibration import calibration_for
from meshplan.cost.osdp import attention_params_per_layer
from meshplan.errors import MeshplanError
from meshplan.export.common import export_job
from meshplan.plan import Job, OpGroup, ParallelDims, Plan
from meshplan.search.planner import search
from meshplan.search.space import SearchOptions
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target, search_options

L70 = model_preset("llama3-70b")
H100 = system_preset("dgx-h100")
TRAIN = TrainingSpec(seq_len=8192, global_batch=32)
CALIB = calibration_for(H100.gpu)
N = 8  # ZeRO shards


def _plan(**osdp) -> Plan:
    return Plan(dims=ParallelDims(dp_shard=N), zero=3, recompute="full", **osdp)


def _est(**osdp):
    return estimate(L70, H100, TRAIN, _plan(**osdp))


def _layer_params() -> tuple[float, float]:
    """(attention + its norm, MLP + its norm) of one Llama-3-70B layer, tp 1."""
    attn = attention_params_per_layer(L70)
    return attn, L70.dense_layer_params() - attn


def test_attention_params_by_hand():
    D, kv = 8192, 8 * 128  # 64 query heads of 128, 8 KV heads
    assert attention_params_per_layer(L70) == 2 * D * D + 2 * D * kv + D  # wq, wo, wk, wv, pre-norm


def test_keeping_attention_by_hand():
    """Kept attention: its weights resident whole (7/8 more than the shard over 8), never
    re-gathered per micro-batch (two gathers of its bytes fewer per layer), its updated weights
    all-gathered once per step instead (ZeRO-2 for that group)."""
    base, kept = _est(), _est(keep_gathered=("attention",))
    attn, mlp = _layer_params()
    wb = CALIB.weight_bytes_per_param
    extra = 80 * attn * wb * (1 - 1 / N)
    assert kept.memory.parameters_bytes - base.memory.parameters_bytes == pytest.approx(extra, rel=1e-9)
    assert kept.memory.kept_weight_bytes == pytest.approx(extra, rel=1e-9)
    link = comms.group_link(H100, CALIB, N, 1)
    m = base.time.num_microbatches
    saved = 2 * 80 * (comms.all_gather_time((attn + mlp) * wb, N, link) - comms.all_gather_time(mlp * wb, N, link))
    assert base.time.microbatch_comm_total_s - kept.time.microbatch_comm_total_s == pytest.approx(m * saved, rel=1e-6)
    step_gather = comms.all_gather_time(80 * attn * wb, N, link)
    assert kept.time.dp_comm_total_s - base.time.dp_comm_total_s == pytest.approx(step_gather, rel=1e-6)
    # the gathered-layer buffer now holds only the MLPs (two layers: current and prefetched)
    assert kept.memory.gathered_weight_bytes == pytest.approx(2 * mlp * wb * (1 - 1 / N), rel=1e-9)


def test_mlp_slices_by_hand():
    """4 slices: two layers' buffer holds attention + a quarter MLP; each gather is 5 collectives
    (the attention and 4 slices) instead of 1: 4 more ring latencies, twice per layer."""
    base, split = _est(), _est(mlp_splits=4)
    attn, mlp = _layer_params()
    wb = CALIB.weight_bytes_per_param
    assert base.memory.gathered_weight_bytes == pytest.approx(2 * (attn + mlp) * wb * (1 - 1 / N), rel=1e-9)
    assert split.memory.gathered_weight_bytes == pytest.approx(2 * (attn + mlp / 4) * wb * (1 - 1 / N), rel=1e-9)
    alpha, _ = comms.group_link(H100, CALIB, N, 1).rates("all_gather")
    m = base.time.num_microbatches
    assert split.time.osdp_gather_latency_s == pytest.approx(m * 80 * 2 * 4 * (N - 1) * alpha, rel=1e-9)
    assert split.time.osdp_compute_s > 0  # narrower GEMMs and their launches
    assert split.time.compute_s == pytest.approx(base.time.compute_s + split.time.osdp_compute_s, rel=1e-9)
    assert split.peak_memory_gib < base.peak_memory_gib


def test_chunked_head_by_hand():
    """8 chunks: one eighth of the logits at once; the head's forward runs again in backward."""
    base, chunked = _est(), _est(head_splits=8)
    assert chunked.memory.logits_bytes == pytest.approx(base.memory.logits_bytes / 8, rel=1e-12)
    saved = base.memory.logits_bytes * 7 / 8
    assert base.memory.activations_bytes - chunked.memory.activations_bytes == pytest.approx(saved, rel=1e-9)
    # 128K vocabulary x 8192 tokens: the logits and loss transients are gigabytes
    assert base.memory.logits_bytes > 4 * 2**30
    assert chunked.time.osdp_compute_s > 0 and chunked.step_time_s > base.step_time_s


def test_no_osdp_changes_nothing():
    base = _est()
    assert base.time.osdp_compute_s == 0 and base.time.osdp_gather_latency_s == 0
    assert base.memory.kept_weight_bytes == 0


@settings(max_examples=15, deadline=None)
@given(mlp=st.sampled_from([1, 2, 4, 8]), head=st.sampled_from([1, 2, 4, 8]),
       keep=st.sets(st.sampled_from(list(OpGroup))))
def test_trades_go_one_way(mlp, head, keep):
    """Splitting never adds memory nor saves time; keeping never saves memory of parameters."""
    if OpGroup.MLP in keep and mlp > 1:
        return
    kept = _est(keep_gathered=tuple(keep))
    both = _est(keep_gathered=tuple(keep), mlp_splits=mlp, head_splits=head)
    assert both.peak_memory_gib <= kept.peak_memory_gib + 1e-9
    assert both.step_time_s >= kept.step_time_s - 1e-12
    assert kept.memory.parameters_bytes >= _est().memory.parameters_bytes


# ---- plan rules, notation, JSON and flags ---------------------------------------------------------
def test_plan_rules():
    with pytest.raises(MeshplanError, match="keep_gathered needs zero 3"):
        Plan(dims=ParallelDims(dp_shard=8), zero=2, keep_gathered=("attention",))
    with pytest.raises(MeshplanError, match="mlp_splits=2 needs zero 3"):
        Plan(zero=0, mlp_splits=2)
    with pytest.raises(MeshplanError, match="a kept MLP"):
        Plan(dims=ParallelDims(dp_shard=8), zero=3, keep_gathered=("mlp",), mlp_splits=2)
    with pytest.raises(MeshplanError, match="each must be one of"):
        Plan(dims=ParallelDims(dp_shard=8), zero=3, keep_gathered=("router",))
    with pytest.raises(MeshplanError, match="head_splits"):
        Plan(head_splits=0)
    with pytest.raises(MeshplanError, match="not divisible"):
        _plan(mlp_splits=3).validate_for(L70, TRAIN, 8)  # F = 28672 = 2^12 * 7
    with pytest.raises(MeshplanError, match="tokens of a micro-batch"):
        _plan(head_splits=3).validate_for(L70, TRAIN, 8)
    moe = model_preset("mixtral-8x7b")
    with pytest.raises(MeshplanError, match="experts"):
        _plan(mlp_splits=2).validate_for(moe, TRAIN, 8)


def test_notation_json_and_flags_round_trip():
    plan = _plan(keep_gathered=("head", "attention"), mlp_splits=4, head_splits=8)
    assert plan.keep_gathered == (OpGroup.ATTENTION, OpGroup.HEAD)  # the enum's order
    assert plan.notation().endswith("keep=attention+head split=mlp4,head8")
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert Plan.from_dict({k: v for k, v in plan.to_dict().items()
                           if k not in ("keep_gathered", "mlp_splits", "head_splits")}) == _plan()
    flags = flags_for(plan)
    assert "--keep-gathered attention+head" in " ".join(flags.argv())
    assert build_plan(8, flags) == plan


# ---- search ------------------------------------------------------------------------------------------
def test_search_adds_frontier_points_only_osdp_makes():
    """Llama-3-8B at 32K tokens on one node: zero-3 plans keeping some groups gathered sit between
    ZeRO-2 and ZeRO-3 in memory, and a chunked LM head lowers the leanest plan's peak: points the
    search without OSDP does not have."""
    model, training = model_preset("llama3-8b"), TrainingSpec(seq_len=32768, global_batch=8)
    off = search(model, H100, training, options=SearchOptions(osdp=False, offloads=(), vocab_parallel=False))
    on = search(model, H100, training, options=SearchOptions(offloads=(), vocab_parallel=False))
    new = [p for p in on.frontier if p.plan.keep_gathered or p.plan.mlp_splits > 1 or p.plan.head_splits > 1]
    assert new
    assert not any(o.step_time_s <= p.step_time_s and o.peak_memory_bytes <= p.peak_memory_bytes
                   for p in new for o in off.frontier)
    for p in new:  # each point is the estimate of its plan
        est = estimate(model, H100, training, p.plan)
        assert est.step_time_s == pytest.approx(p.step_time_s, rel=1e-9)
        assert p.plan.zero == 3 or not (p.plan.keep_gathered or p.plan.mlp_splits > 1)
    assert any(p.plan.keep_gathered for p in new)
    assert on.min_memory_bytes < off.min_memory_bytes  # the logits of 32K tokens a chunk at a time


def test_search_for_meshplan_proposes_only_what_it_runs():
    model, training = model_preset("llama3-8b"), TrainingSpec(seq_len=32768, global_batch=8)
    res = search(model, H100, training, options=search_options(Target.MESHPLAN, model, training))
    for p in res.frontier:
        assert not (p.plan.head_splits > 1 and (p.plan.dims.tp > 1 or p.plan.dims.pp > 1))
        assert not (p.plan.mlp_splits > 1 and p.plan.dims.tp > 1)


# ---- exporters ---------------------------------------------------------------------------------------
def _job(**osdp) -> Job:
    return Job(model=L70, training=TRAIN, cluster=H100, plan=_plan(**osdp))


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_megatron_and_torchtitan_refuse(target):
    with pytest.raises(MeshplanError, match="keep=attention"):
        export_job(_job(keep_gathered=("attention",)), target)


def test_deepspeed_keeps_attention_by_persistence_threshold():
    cfg = json.loads(export_job(_job(keep_gathered=("attention",)), "deepspeed").text)
    threshold = cfg["zero_optimization"]["stage3_param_persistence_threshold"]
    assert threshold == 8192 * 8192 + 1  # above wq/wo (D x D), at most an MLP matrix (D x F)
    with pytest.raises(MeshplanError, match="no operator splitting"):
        export_job(_job(head_splits=2), "deepspeed")
    with pytest.raises(MeshplanError, match="only keep_gathered=attention"):
        export_job(_job(keep_gathered=("head",)), "deepspeed")
