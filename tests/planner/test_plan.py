"""Plan / Job contract: validation names the bad value, JSON round-trips, defaults are filled."""

import json

import pytest

from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan, Recompute, Schedule, even_split
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

LLAMA70 = model_preset("llama3-70b")
T = TrainingSpec(seq_len=8192, global_batch=1024)


def test_world_size_and_mesh_shape():
    d = ParallelDims(dp_replicate=2, dp_shard=4, tp=8, pp=4, cp=2)
    assert d.world_size == 2 * 4 * 8 * 4 * 2
    assert d.mesh_shape == (4, 2, 4, 2, 8)  # pp, dp_replicate, dp_shard, cp, tp
    assert d.dp == 8


def test_even_split_puts_remainder_first():
    assert even_split(10, 4) == (3, 3, 2, 2)
    assert sum(even_split(126, 16)) == 126
    with pytest.raises(MeshplanError):
        even_split(2, 4)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(dims=ParallelDims(dp_shard=4)), "zero"),
    (dict(sp=True), "tp > 1"),
    (dict(vpp=2, dims=ParallelDims(pp=2)), "interleaved"),
    (dict(zero=5), "zero"),
    (dict(micro_batch=0), "micro_batch"),
    (dict(dims=ParallelDims(pp=2), stage_layers=(3,)), "stage_layers"),
    (dict(recompute_layers=(1,)), "recompute"),
])
def test_invalid_plans_name_the_value(kwargs, needle):
    with pytest.raises(MeshplanError, match=needle):
        Plan(**kwargs)


def test_ep_must_divide_dp_shard_cp():
    with pytest.raises(MeshplanError, match="ep=4"):
        ParallelDims(dp_shard=2, ep=4)


@pytest.mark.parametrize("plan,needle", [
    (Plan(dims=ParallelDims(tp=3)), "num_heads=64 is not divisible by tp=3"),
    (Plan(dims=ParallelDims(dp_replicate=3)), "global_batch=1024"),
    (Plan(dims=ParallelDims(pp=2), stage_layers=(10, 10)), "sum to 20"),
    (Plan(dims=ParallelDims(dp_shard=2, ep=2), zero=1), "dense"),
])
def test_validate_for_model(plan, needle):
    with pytest.raises(MeshplanError, match=needle):
        plan.validate_for(LLAMA70, T)


def test_degrees_must_match_gpu_count():
    with pytest.raises(MeshplanError, match="do not equal the GPU count 16"):
        Plan(dims=ParallelDims(tp=8)).validate_for(LLAMA70, T, num_gpus=16)


def test_job_json_round_trip(tmp_path):
    cluster = resolve_cluster("dgx-h100", nodes=64)
    plan = Plan(
        dims=ParallelDims(dp_shard=16, tp=8, pp=4), zero=1, sp=True,
        schedule=Schedule.INTERLEAVED_1F1B, vpp=5, recompute=Recompute.SELECTIVE,
    ).with_defaults(LLAMA70)
    assert plan.stage_layers == (4,) * 20 and plan.recompute_layers == plan.stage_layers
    job = Job(model=LLAMA70, training=T, cluster=cluster, plan=plan)
    path = tmp_path / "plan.json"
    job.save(path)
    assert Job.load(path) == job
    data = json.loads(path.read_text())
    assert data["meshplan_plan_version"] == 3 and data["plan"]["schedule"] == "interleaved-1f1b"


def test_job_load_errors(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(MeshplanError, match="not valid JSON"):
        Job.load(p)
    p.write_text("{}")
    with pytest.raises(MeshplanError, match="not a meshplan plan file"):
        Job.load(p)
    with pytest.raises(MeshplanError, match="no such plan file"):
        Job.load(tmp_path / "missing.json")


def test_notation():
    p = Plan(dims=ParallelDims(dp_replicate=2, dp_shard=8, tp=8, pp=4), zero=3, sp=True,
             schedule="interleaved-1f1b", vpp=2, recompute="selective", recompute_layers=(3,) * 8)
    assert p.notation() == "dp16 fsdp8 tp8sp pp4(interleaved-1f1b,v2) cp1 mb1 ckpt=sel:3x8"
