"""Jobs shared by the export tests (each golden file under tests/golden/export/ is one of them)."""

from meshplan.plan import Job, ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.cluster import cluster_for_gpu, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec


def gpt3_narayanan() -> Job:
    """GPT-3 175B as run in Narayanan et al. 2021: TP 8, PP 8 interleaved (4 layers per virtual
    stage), micro-batch 1, global batch 1536, seq 2048, fp16, full recompute, 1536 A100s."""
    return Job(
        model=model_preset("gpt3-175b"),
        training=TrainingSpec(seq_len=2048, global_batch=1536, precision=Precision.FP16),
        cluster=cluster_for_gpu("a100-80gb", num_nodes=192),
        plan=Plan(dims=ParallelDims(dp_replicate=24, tp=8, pp=8), schedule=Schedule.INTERLEAVED_1F1B,
                  vpp=3, micro_batch=1, recompute=Recompute.FULL),
    )


def llama70b_hsdp() -> Job:
    """Llama-3-70B, HSDP (2 x 4) x TP 8 x PP 4 interleaved, selective recompute, bf16."""
    return Job(
        model=model_preset("llama3-70b"),
        training=TrainingSpec(seq_len=8192, global_batch=256),
        cluster=system_preset("dgx-h100", num_nodes=32),
        plan=Plan(dims=ParallelDims(dp_replicate=2, dp_shard=4, tp=8, pp=4), zero=1, sp=True,
                  schedule=Schedule.INTERLEAVED_1F1B, vpp=2, micro_batch=1, recompute=Recompute.SELECTIVE),
    )


def llama8b_zero2() -> Job:
    """Llama-3-8B, ZeRO-2 over 16 GPUs, micro-batch 2, full recompute."""
    return Job(
        model=model_preset("llama3-8b"),
        training=TrainingSpec(seq_len=4096, global_batch=64),
        cluster=system_preset("dgx-h100", num_nodes=2),
        plan=Plan(dims=ParallelDims(dp_shard=16), zero=2, micro_batch=2, recompute=Recompute.FULL),
    )


def mixtral_ep() -> Job:
    """Mixtral-8x7B: FSDP 8 x EP 8 (reusing the sharded ranks) x TP 2, 1F1B over pp 2 with an
    uneven split (17 + 15 layers), no recompute."""
    return Job(
        model=model_preset("mixtral-8x7b"),
        training=TrainingSpec(seq_len=4096, global_batch=64),
        cluster=system_preset("dgx-h100", num_nodes=4),
        plan=Plan(dims=ParallelDims(dp_shard=8, ep=8, tp=2, pp=2), zero=3, sp=True, micro_batch=1,
                  stage_layers=(15, 17)),
    )
