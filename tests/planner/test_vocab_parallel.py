"""Vocabulary parallelism over pipeline ranks (issue 17; Yeung et al. 2024): cost by hand, plan
rules, the search's choice, and the stacks that refuse it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan.cli.plan_flags import build_plan, flags_for
from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.errors import MeshplanError
from meshplan.export.common import export_job
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.search.planner import search
from meshplan.search.space import SearchOptions
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target, why_not

L8 = model_preset("llama3-8b")  # 32 layers, 128K vocabulary, untied head
H100 = system_preset("dgx-h100")
TRAIN = TrainingSpec(seq_len=4096, global_batch=64)


def _est(vp: bool, model=L8, **dims):
    dims = dims or dict(pp=4, dp_replicate=2)
    return estimate(model, H100, TRAIN, Plan(dims=ParallelDims(**dims), vocab_parallel=vp))


def test_every_rank_holds_a_quarter_of_embedding_and_head():
    base, vp = _est(False), _est(True)
    wb = calibration_for(H100.gpu).weight_bytes_per_param
    p = [s.memory.parameters_bytes for s in base.stages]
    q = [s.memory.parameters_bytes for s in vp.stages]
    emb, head = L8.embedding_params() * wb, L8.head_params() * wb
    assert p[0] - p[1] == pytest.approx(emb, rel=1e-9)
    assert p[3] - p[1] == pytest.approx(head, rel=1e-9)
    assert q[0] == pytest.approx(q[1], rel=1e-12) and q[3] == pytest.approx(q[1], rel=1e-12)
    assert q[1] - p[1] == pytest.approx((emb + head) / 4, rel=1e-9)


def test_the_last_stage_no_longer_paces_the_pipeline():
    base, vp = _est(False), _est(True)
    assert base.stages[3].microbatch_time_s > base.stages[1].microbatch_time_s  # head on the last
    spread = max(s.microbatch_time_s for s in vp.stages) - min(s.microbatch_time_s for s in vp.stages)
    assert spread < base.stages[3].microbatch_time_s - base.stages[1].microbatch_time_s
    assert vp.time.microbatch_comm_total_s > base.time.microbatch_comm_total_s  # the synchronisation
    assert vp.step_time_s < base.step_time_s


def test_tied_head_needs_no_copy():
    tied = L8.with_overrides({"tied_embeddings": "true"})
    vp = _est(True, model=tied)
    wb = calibration_for(H100.gpu).weight_bytes_per_param
    base = _est(False, model=tied)
    # without: the last rank holds a copy of the embedding; with: one quarter of it, once
    assert base.stages[3].memory.parameters_bytes - base.stages[1].memory.parameters_bytes > tied.vocab_size * tied.hidden_size * wb * 0.99
    assert vp.stages[3].memory.parameters_bytes == pytest.approx(vp.stages[1].memory.parameters_bytes, rel=1e-12)


def test_plan_rules_json_and_flags():
    with pytest.raises(MeshplanError, match="needs pp > 1"):
        Plan(vocab_parallel=True)
    p = Plan(dims=ParallelDims(pp=4, dp_replicate=2), vocab_parallel=True)
    assert "pp4(1f1b)vocab" in p.notation()
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    old = p.to_dict()
    del old["vocab_parallel"]
    assert Plan.from_dict(old).vocab_parallel is False
    assert build_plan(8, flags_for(p)).with_defaults(L8) == p.with_defaults(L8)
    assert "--vocab-parallel" in flags_for(p).argv()


def test_search_picks_it_for_a_large_vocabulary():
    model = model_preset("qwen2.5-72b")  # 152K vocabulary
    cluster = system_preset("dgx-h100", num_nodes=8)
    # seq 4096: at 8192 a cp4 FSDP plan without a pipeline is now the fastest that fits (sequence
    # parallel pays the backward's input re-gather since session 7, cost/tp_backward.py)
    training = TrainingSpec(seq_len=4096, global_batch=256)
    without = search(model, cluster, training, options=SearchOptions(vocab_parallel=False, offloads=()))
    with_ = search(model, cluster, training, options=SearchOptions(offloads=()))
    assert not any(p.plan.vocab_parallel for p in without.frontier)
    rec = with_.recommended
    assert rec.plan.vocab_parallel and rec.step_time_s < without.recommended.step_time_s
    assert estimate(model, cluster, training, rec.plan).step_time_s == pytest.approx(rec.step_time_s, rel=1e-9)


def test_runtime_runs_it_with_gpipe_or_1f1b_over_pp_only():
    gpipe = Plan(dims=ParallelDims(pp=4, dp_replicate=2), vocab_parallel=True, schedule="gpipe")
    assert why_not(Target.MESHPLAN, L8, TRAIN, gpipe) is None
    assert why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, schedule="1f1b")) is None
    assert why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, dims=ParallelDims(pp=4, cp=2))) is None
    interleaved = replace(gpipe, schedule="interleaved-1f1b", vpp=2)
    assert "gpipe or 1f1b" in why_not(Target.MESHPLAN, L8, TRAIN, interleaved)
    assert "tp=2" in why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, dims=ParallelDims(pp=4, tp=2)))
    assert "divisible by pp=3" in why_not(Target.MESHPLAN, L8.with_overrides({"vocab_size": 128257}), TRAIN,
                                          replace(gpipe, dims=ParallelDims(pp=3)))
    assert why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, vocab_parallel=False, schedule="1f1b")) is None
    assert "OSDP" in why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, zero=3, dims=ParallelDims(pp=4, dp_shard=2),
                                                                   keep_gathered=("head",)))
    assert why_not(Target.MESHPLAN, L8, TRAIN, replace(gpipe, zero=3, dims=ParallelDims(pp=4, dp_shard=2),
                                                       keep_gathered=("attention",))) is None


def test_exporters_refuse_it():
    p = Plan(dims=ParallelDims(pp=4, dp_replicate=2), vocab_parallel=True)
    job = Job(model=L8, training=TRAIN, cluster=H100, plan=p)
    for target in ("megatron", "megatron-bridge", "deepspeed", "torchtitan"):
        with pytest.raises(MeshplanError, match="vocabulary parallelism"):
            export_job(job, target)


def test_the_choice_only_adds_points():
    """Searched on top of the rest, vocabulary parallelism never loses a point of the frontier
    without it: every such point is matched or beaten."""
    cluster = system_preset("dgx-h100", num_nodes=2)
    base = search(L8, cluster, TRAIN, options=SearchOptions(vocab_parallel=False, offloads=()))
    more = search(L8, cluster, TRAIN, options=SearchOptions(offloads=()))
    for pt in base.frontier:
        assert any(q.step_time_s <= pt.step_time_s * (1 + 1e-12) and q.peak_memory_bytes <= pt.peak_memory_bytes * (1 + 1e-12)
                   for q in more.frontier)
