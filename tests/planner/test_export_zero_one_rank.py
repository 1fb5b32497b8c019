"""ZeRO where dp_shard x cp is small: over one rank, over the context-parallel ranks alone.

Each target exports such a plan as the stack runs it and reads it back unchanged, or refuses it
with one line: Megatron-LM's distributed optimizer over one-rank instances
(--num-distributed-optimizer-instances = dp * cp, megatron/core/parallel_state.py@00caa53),
torchtitan's FSDP over dp_shard x cp whenever cp > 1 (ParallelDims.fsdp_enabled), DeepSpeed's
ZeRO over every data-parallel rank.
"""

import json
import tomllib
from dataclasses import replace

import pytest

from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.import_torchtitan import import_torchtitan
from meshplan.export.import_torchtitan_cli import parse_command_line
from meshplan.export.megatron_bridge import import_megatron_bridge
from meshplan.plan import Job, Offload, ParallelDims, Plan
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODEL = model_preset("llama3-8b")


def _job(dims: ParallelDims, zero: int, **plan) -> Job:
    return Job(model=MODEL, training=TrainingSpec(seq_len=4096, global_batch=64),
               cluster=cluster_for_gpu("h100-sxm", gpus_per_node=dims.world_size),
               plan=Plan(dims=dims, zero=zero, **plan))


REPLICAS_ONE_RANK = ParallelDims(dp_replicate=4)  # dp 4, dp_shard x cp = 1
SINGLE_RANK_TP = ParallelDims(tp=4)  # dp 1
CP_ALONE = ParallelDims(dp_replicate=2, cp=2)  # dp_shard 1, cp 2


@pytest.mark.parametrize("dims,flags", [
    (REPLICAS_ONE_RANK, "--use-distributed-optimizer --num-distributed-optimizer-instances 4"),
    (SINGLE_RANK_TP, "--use-distributed-optimizer"),
    (CP_ALONE, "--use-distributed-optimizer --num-distributed-optimizer-instances 2"),
])
def test_megatron_zero1_small_shard_roundtrips(dims, flags):
    """Zero 1 with dp_shard 1 is Megatron's distributed optimizer (not plain DDP, which reads
    back as zero 0): the plan comes back unchanged, through Megatron-LM and Megatron-Bridge."""
    job = _job(dims, 1)
    text = export_job(job, "megatron").text
    assert flags in " ".join(text.replace("\\", " ").split())
    want = job.plan.with_defaults(MODEL)
    assert import_megatron(text, num_gpus=dims.world_size).plan.with_defaults(MODEL) == want
    bridge = export_job(job, "megatron-bridge").text
    assert import_megatron_bridge(bridge, num_gpus=dims.world_size, model=MODEL).plan.with_defaults(MODEL) == want


def test_megatron_optimizer_offload_over_one_rank():
    """The distributed optimizer over one rank offloads like any other (--optimizer-cpu-offload)."""
    job = _job(SINGLE_RANK_TP, 1, offload=(Offload.OPTIMIZER,))
    text = export_job(job, "megatron").text
    assert "--optimizer-cpu-offload" in text
    assert import_megatron(text, num_gpus=4).plan.with_defaults(MODEL) == job.plan.with_defaults(MODEL)


def test_megatron_zero3_with_replicas_refused():
    with pytest.raises(MeshplanError, match="without replication"):
        export_job(_job(REPLICAS_ONE_RANK, 3), "megatron")


ARGS = "--global-batch-size 64 --seq-length 4096 --use-distributed-optimizer"


@pytest.mark.parametrize("extra,gpus,msg", [
    # Megatron's rule is over dp x cp: 3 does not divide 4 x 2
    ("--context-parallel-size 2 --num-distributed-optimizer-instances 3", 8, r"does not divide dp\*cp=8"),
    # Megatron runs 4 instances over dp 2 x cp 4 (each half a data-parallel rank's cp ranks);
    # meshplan's replicas are whole data-parallel ranks
    ("--context-parallel-size 4 --num-distributed-optimizer-instances 4", 8, "splits the context-parallel"),
])
def test_megatron_import_instances(extra, gpus, msg):
    with pytest.raises(MeshplanError, match=msg):
        import_megatron(f"{ARGS} {extra}", num_gpus=gpus)


def test_megatron_import_instances_over_dp_times_cp():
    """dp 2, cp 4, 2 instances: each instance shards over one data-parallel rank's 4 cp ranks."""
    plan = import_megatron(f"{ARGS} --context-parallel-size 4 --num-distributed-optimizer-instances 2",
                           num_gpus=8).plan
    assert (plan.zero, plan.dims.dp_replicate, plan.dims.dp_shard, plan.dims.cp) == (1, 2, 1, 4)


@pytest.mark.parametrize("zero,policy", [(2, "never"), (3, "always")])
def test_torchtitan_fsdp_over_cp_alone(zero, policy):
    """torchtitan shards over dp_shard x cp whenever cp > 1: zero 2/3 over cp alone round-trips."""
    job = _job(CP_ALONE, zero)
    cfg = tomllib.loads(export_job(job, "torchtitan", "0.2.0").text)
    assert cfg["parallelism"]["fsdp_reshard_after_forward"] == policy
    back = import_torchtitan(cfg, num_gpus=4, num_layers=MODEL.num_layers).plan
    assert (back.zero, back.dims) == (zero, CP_ALONE)
    cli = export_job(job, "torchtitan", "0.3.0").text  # the >= 0.3 command line
    assert f"--parallelism.fsdp_reshard_after_forward {policy}" in cli
    back = import_torchtitan(parse_command_line(cli).cfg, num_gpus=4, num_layers=MODEL.num_layers).plan
    assert (back.zero, back.dims) == (zero, CP_ALONE)


@pytest.mark.parametrize("dims,zero,msg", [
    (CP_ALONE, 0, "zero 0 with cp 2 is not expressible"),
    (REPLICAS_ONE_RANK, 1, "zero 1 over dp_shard 1 x cp 1 = 1 rank is not expressible"),
    (SINGLE_RANK_TP, 3, "zero 3 over dp_shard 1 x cp 1 = 1 rank"),
])
def test_torchtitan_refuses_what_it_does_not_run(dims, zero, msg):
    with pytest.raises(MeshplanError, match=msg):
        export_job(_job(dims, zero), "torchtitan", "0.2.0")


def test_torchtitan_default_reshard_keeps_parameters_with_pipeline():
    """torchtitan's 'default' policy reshards after forward only without pipeline parallel."""
    cfg = {"parallelism": {"data_parallel_shard_degree": 2, "pipeline_parallel_degree": 2},
           "training": {"seq_len": 4096, "global_batch_size": 64}}
    assert import_torchtitan(cfg, num_gpus=4, num_layers=MODEL.num_layers).plan.zero == 2
    cfg["parallelism"]["pipeline_parallel_degree"] = 1
    assert import_torchtitan(cfg, num_gpus=2, num_layers=MODEL.num_layers).plan.zero == 3
    cfg["parallelism"]["fsdp_reshard_after_forward"] = "sometimes"
    with pytest.raises(MeshplanError, match="'sometimes' is not one of"):
        import_torchtitan(cfg, num_gpus=2, num_layers=MODEL.num_layers)


def test_deepspeed_zero_over_one_rank():
    """DeepSpeed partitions over every data-parallel rank: over a single one the stage is as
    planned (ZeRO-Offload on one data-parallel rank); replicas of a one-rank partition are refused."""
    job = _job(SINGLE_RANK_TP, 1, offload=(Offload.OPTIMIZER,))
    cfg = json.loads(export_job(job, "deepspeed").text)
    assert cfg["zero_optimization"]["stage"] == 1 and "offload_optimizer" in cfg["zero_optimization"]
    with pytest.raises(MeshplanError, match="zero 1 over dp_shard 1 with 4 replicas is not expressible"):
        export_job(_job(REPLICAS_ONE_RANK, 1), "deepspeed")
    assert json.loads(export_job(replace(job, plan=Plan(dims=REPLICAS_ONE_RANK)), "deepspeed").text)[
        "zero_optimization"]["stage"] == 0
