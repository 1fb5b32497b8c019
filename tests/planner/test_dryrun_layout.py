"""The dry-run layout (runtime/dryrun_layout.py, no torch) counts each rank's parameters from the
layer kinds and the runtime's stage cut, independently of the cost model's terms: on every plan of
searched frontiers and on hand-made pipeline plans (interleaved, tied heads, vocabulary parallel,
expert parallel with etp, ZeRO-3) they are the cost model's weights of that rank's stage."""

from __future__ import annotations

import pytest

from meshplan.calib.hardware import resolve_hardware
from meshplan.plan import Job, ParallelDims, Plan, Schedule
from meshplan.runtime.dryrun_launch import parse_ranks
from meshplan.runtime.dryrun_layout import layout
from meshplan.search.planner import search
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def _check(job: Job, hw) -> int:
    _, builds = layout(job, parse_ranks("all" if job.plan.dims.world_size <= 64 else "first,last", job), hw.calib)
    for b in builds:
        if b.weights_on_host:  # the cost model's device weights are then the gathered ones only
            continue
        want = b.model_memory["weight_shard_bytes"]
        assert b.layout_weight_bytes == pytest.approx(want, rel=1e-9), (job.plan.notation(), b.rank)
    return len(builds)


@pytest.mark.parametrize("model, gpus, seq, batch", [("llama3-8b", 64, 4096, 256), ("mixtral-8x7b", 64, 4096, 256),
                                                      ("gpt2", 16, 1024, 64)])
def test_every_frontier_plan(model, gpus, seq, batch):
    spec, training = model_preset(model), TrainingSpec(seq_len=seq, global_batch=batch)
    hw = resolve_hardware(resolve_cluster("dgx-h100", gpus=gpus), training.precision, None, "meshplan")
    res = search(spec, hw.cluster, training, calib=hw.calib)
    assert len(res.frontier) >= 5
    for point in res.frontier:
        _check(Job(model=spec, training=training, cluster=hw.cluster, plan=point.plan), hw)


@pytest.mark.parametrize("model, dims, extra", [
    ("gpt2", ParallelDims(pp=4, dp_shard=2), dict(zero=1)),  # tied head: the last stage's copy of the table
    ("gpt2", ParallelDims(pp=2, dp_shard=2), dict(zero=1, vocab_parallel=True, schedule=Schedule.GPIPE)),
    ("llama3-8b", ParallelDims(pp=4, tp=2, dp_shard=2), dict(zero=3, sp=True, vpp=2,
                                                             schedule=Schedule.INTERLEAVED_1F1B)),
    ("mixtral-8x7b", ParallelDims(pp=2, tp=2, dp_shard=4, ep=4, etp=1), dict(zero=3, sp=True)),
    ("mixtral-8x7b", ParallelDims(pp=2, dp_shard=8, ep=8), dict(zero=1)),
])
def test_hand_made_pipeline_plans(model, dims, extra):
    spec, training = model_preset(model), TrainingSpec(seq_len=1024, global_batch=64)
    hw = resolve_hardware(resolve_cluster("dgx-h100", gpus=dims.world_size), training.precision, None, "meshplan")
    plan = Plan(dims=dims, **extra)
    plan.validate_for(spec, training, dims.world_size)
    assert _check(Job(model=spec, training=training, cluster=hw.cluster, plan=plan), hw) == dims.world_size
