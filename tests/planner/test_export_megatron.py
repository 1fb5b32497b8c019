"""Megatron-LM export details: MoE and GQA shape arguments, mappings that warn, refusals."""

from dataclasses import replace

import pytest

import export_cases as cases
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron import megatron_args
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.presets import model_preset


def flags(job) -> dict[str, list[str]]:
    args, _ = megatron_args(job)
    return {a[0]: a[1:] for a in args}


def test_moe_arguments_and_roundtrip():
    job = cases.mixtral_ep()
    job = replace(job, plan=Plan(dims=ParallelDims(dp_shard=8, ep=8, tp=2, pp=2), zero=1, sp=True,
                                 stage_layers=(15, 17), cp_method=CPMethod.RING))
    f = flags(job)
    assert f["--num-experts"] == ["8"] and f["--moe-router-topk"] == ["2"]
    assert f["--moe-ffn-hidden-size"] == ["14336"] and f["--expert-model-parallel-size"] == ["8"]
    assert f["--num-query-groups"] == ["8"] and "--group-query-attention" in f
    assert f["--decoder-first-pipeline-num-layers"] == ["15"] and f["--decoder-last-pipeline-num-layers"] == ["17"]
    back = import_megatron(export_job(job, "megatron").text, num_gpus=job.cluster.num_gpus)
    assert back.model.num_params() == model_preset("mixtral-8x7b").num_params()
    assert back.model.num_params(active_only=True) == model_preset("mixtral-8x7b").num_params(active_only=True)
    assert back.plan.with_defaults(back.model) == job.full_plan


def test_biases_and_encoder_warn():
    job = cases.gpt3_narayanan()
    bert = replace(job, model=model_preset("bert-large"),
                   training=replace(job.training, seq_len=512))
    _, warnings = megatron_args(bert)
    assert any("pretrain_bert.py" in w for w in warnings)
    qwen = replace(job, model=model_preset("qwen2.5-7b"), plan=Plan(dims=ParallelDims(dp_replicate=1536)))
    f = flags(qwen)
    assert "--disable-bias-linear" in f and "--add-qkv-bias" in f  # q/k/v bias only


def test_gpipe_warns_zero_bubble_refused():
    job = cases.gpt3_narayanan()
    gpipe = replace(job, plan=replace(job.plan, schedule=Schedule.GPIPE, vpp=1))
    assert any("1F1B runs instead" in w for w in export_job(gpipe, "megatron").warnings)
    zb = replace(job, plan=replace(job.plan, schedule=Schedule.ZERO_BUBBLE))
    with pytest.raises(MeshplanError, match="no zero-bubble"):
        export_job(zb, "megatron")


def test_partial_selective_refused_everywhere_but_torchtitan_every_kth():
    job = cases.llama8b_zero2()
    plan = replace(job.plan, recompute_layers=(16,))
    partial = replace(job, plan=plan)
    text = export_job(partial, "megatron").text  # full, 16 of 32 layers: block method
    assert "--recompute-method block \\" in text and "--recompute-num-layers 16 \\" in text
    # every 2nd of 32: torchtitan's TOML form (< 0.3) had layer-level selective checkpointing
    assert 'selective_ac_option = "2"' in export_job(partial, "torchtitan", "0.2.0").text
    with pytest.raises(MeshplanError, match="dropped layer-level selective"):
        export_job(partial, "torchtitan", "0.3.0")
    odd = replace(job, plan=replace(job.plan, recompute_layers=(7,)))  # 32 // k is never 7
    with pytest.raises(MeshplanError, match="every k-th block"):
        export_job(odd, "torchtitan", "0.2.0")


def test_block_recompute_covers_short_stages():
    """block k recomputes min(k, n) layers of an n-layer stage: (3, 4) of (3, 5) is block 4."""
    job = cases.gpt3_narayanan()
    plan = Plan(dims=ParallelDims(dp_replicate=24, tp=8, pp=8), micro_batch=1, recompute=Recompute.FULL,
                stage_layers=(10, 13, 13, 13, 13, 13, 13, 8), recompute_layers=(9,) * 7 + (8,))
    text = export_job(replace(job, plan=plan), "megatron").text
    assert "--recompute-method block \\" in text and "--recompute-num-layers 9 \\" in text
    assert import_megatron(text, num_gpus=1536).plan == plan
    bad = replace(plan, recompute_layers=(9,) * 7 + (7,))
    with pytest.raises(MeshplanError, match="first k layers"):
        export_job(replace(job, plan=bad), "megatron")


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "gpt-oss-120b", "nemotron-3-super"])
def test_2026_layouts_roundtrip_through_megatron_arguments(name):
    """MLA, MTP, QK-norm, sliding windows + sinks, hybrid Mamba and LatentMoE survive export + import."""
    from meshplan.plan import Job
    from meshplan.spec.cluster import resolve_cluster
    from meshplan.spec.training import TrainingSpec

    model = model_preset(name)
    job = Job(model=model, training=TrainingSpec(seq_len=4096, global_batch=64),
              cluster=resolve_cluster("dgx-h100", gpus=64), plan=Plan(dims=ParallelDims(dp_shard=8, ep=8, tp=8), zero=1))
    back = import_megatron(export_job(job, "megatron").text, num_gpus=64).model
    got, want = back.to_dict(), model.to_dict()
    # Megatron gives the shared experts' total width only: n experts of the routed width when it
    # divides (Nemotron 3 Super: 5376 = 2 x 2688), the same parameters and FLOPs.
    for key in ("name", "max_position", "moe_shared_experts", "moe_shared_ffn_hidden_size"):
        got.pop(key), want.pop(key)
    assert {k: v for k, v in got.items() if got[k] != want[k]} == {}
    assert (back.moe_shared_experts * back.moe_shared_ffn_hidden_size
            == model.moe_shared_experts * model.moe_shared_ffn_hidden_size)
    assert back.num_params() == model.num_params()


@pytest.mark.parametrize("dp_replicate", [1, 2])
@pytest.mark.parametrize("zero", [1, 3])
def test_zero_over_context_parallel_ranks_alone_roundtrips(dp_replicate, zero):
    """dp_shard 1, cp 4, zero >= 1: meshplan shards over dp_shard x cp (4 ways), and so does
    Megatron-LM (the distributed optimizer over intra_dp_cp_group, FSDP2 over the dp x cp group):
    the export writes the sharding flag and reads back as the same plan, costed the same."""
    from meshplan.cost import estimate
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.training import TrainingSpec

    model = model_preset("llama3-8b")
    plan = Plan(dims=ParallelDims(dp_replicate=dp_replicate, dp_shard=1, cp=4, tp=2), zero=zero, sp=True)
    job = replace(cases.llama8b_zero2(), model=model, plan=plan,
                  training=TrainingSpec(seq_len=16384, global_batch=16),
                  cluster=system_preset("dgx-h100", num_nodes=dp_replicate))
    if zero == 3 and dp_replicate > 1:  # Megatron's FSDP2 has no replicas (HSDP)
        with pytest.raises(MeshplanError, match="without replication"):
            megatron_args(job)
        return
    f = flags(job)
    assert ("--use-torch-fsdp2" if zero == 3 else "--use-distributed-optimizer") in f
    if zero == 1:
        assert "--overlap-param-gather" in f and "--overlap-grad-reduce" in f
        assert f.get("--num-distributed-optimizer-instances") == (["2"] if dp_replicate > 1 else None)
    back = import_megatron(export_job(job, "megatron").text, num_gpus=job.cluster.num_gpus, model=model)
    assert back.plan.with_defaults(model) == job.full_plan
    assert back.training.overlap_grad_reduce is job.training.overlap_grad_reduce
    mine = estimate(model, job.cluster, job.training, job.plan)
    theirs = estimate(model, job.cluster, back.training, back.plan)
    assert theirs.peak_memory_gib == mine.peak_memory_gib and theirs.step_time_s == mine.step_time_s
    # what the import read before: the optimizer replicated over the cp ranks, more memory per GPU
    unsharded = estimate(model, job.cluster, job.training, replace(plan, zero=0))
    assert theirs.peak_memory_gib < unsharded.peak_memory_gib


def test_context_parallel_gradient_reduction_overlap_roundtrips():
    """No data parallelism, cp 2, zero 0: Megatron's DDP still reduces the gradients over the cp
    ranks, so --overlap-grad-reduce is written when the plan overlaps it and its absence reads as
    the reduction after the backward."""
    job = replace(cases.llama8b_zero2(), plan=Plan(dims=ParallelDims(cp=2, tp=8), zero=0, sp=True))
    assert "--overlap-grad-reduce" in flags(job) and "--use-distributed-optimizer" not in flags(job)
    text = export_job(job, "megatron").text
    assert import_megatron(text, num_gpus=16).training.overlap_grad_reduce is True
    off = import_megatron(text.replace("--overlap-grad-reduce", ""), num_gpus=16).training
    assert off.overlap_grad_reduce is False
