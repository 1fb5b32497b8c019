"""Issue 15 item 2: a plan searched for a stack is one that stack runs. Every frontier point of a
job planned with ``--target X`` (``meshplan.targets.search_options``, the stack's calibration) is
written by X's exporter; before, ``--target megatron`` offered ZeRO-3 with replicas or a pipeline
(the README's ``dp256 fsdp64 tp4sp``), which the Megatron exporter refuses."""

from dataclasses import replace

import pytest

from meshplan.calib.hardware import resolve_hardware
from meshplan.export.common import export_job
from meshplan.plan import Job
from meshplan.search.planner import search
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import search_options

JOBS = [("llama3-8b", "dgx-h100", 2, 4096, 128), ("llama2-7b", "dgx-a100", 4, 4096, 256),
        ("llama3-70b", "dgx-h100", 8, 8192, 256), ("mixtral-8x7b", "dgx-h100", 4, 4096, 256)]


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge", "torchtitan", "deepspeed"])
@pytest.mark.parametrize("name, cluster_name, nodes, seq_len, batch", JOBS)
def test_every_frontier_point_of_a_target_is_written_by_its_exporter(target, name, cluster_name, nodes,
                                                                      seq_len, batch):
    model = model_preset(name)
    cluster = resolve_cluster(cluster_name, nodes=nodes)
    training = TrainingSpec(seq_len=seq_len, global_batch=batch)
    stack = "megatron" if target == "megatron-bridge" else target
    hw = resolve_hardware(cluster, training.precision, None, stack)
    res = search(model, hw.cluster, training, calib=hw.calib, options=search_options(stack, model, training))
    assert res.frontier
    job = Job(model=model, training=training, cluster=cluster, plan=res.frontier[0].plan)
    for point in res.frontier:
        export_job(replace(job, plan=point.plan), target)  # raises MeshplanError if the stack cannot run it
