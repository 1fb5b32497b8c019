"""--target: the search writes only plans the target runs, by the same rules the runtime checks."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.plan import Job
from meshplan.runtime.support import check_runnable
from meshplan.search.planner import search
from meshplan.search.space import enumerate_space
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target, runnable_mask, search_options, why_not

JOBS = [
    ("mixtral-8x7b", 2, 4096, 64),
    ("gpt2", 1, 1024, 32),
    ("llama3-8b", 8, 8192, 128),
]


@pytest.mark.parametrize("name,nodes,seq,batch", JOBS)
def test_every_frontier_point_for_meshplan_passes_the_runtime_check(name, nodes, seq, batch):
    model, cluster = model_preset(name), system_preset("dgx-h100", num_nodes=nodes)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    res = search(model, cluster, training, options=search_options(Target.MESHPLAN, model, training))
    assert res.frontier
    for point in res.frontier:
        job = Job(model=model, training=training, cluster=cluster, plan=point.plan)
        check_runnable(job)  # raises on a plan train would refuse


def test_the_unrestricted_space_holds_plans_meshplan_refuses():
    """Without the target the search proposes MoE with tp + sp, which the runtime refuses."""
    model, cluster = model_preset("mixtral-8x7b"), system_preset("dgx-h100", num_nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    refused = [p for p in search(model, cluster, training).frontier
               if why_not(Target.MESHPLAN, model, training, p.plan) is not None]
    assert refused


@pytest.mark.parametrize("name,nodes,seq,batch", JOBS)
def test_mask_and_single_plan_check_agree(name, nodes, seq, batch):
    model, cluster = model_preset(name), system_preset("dgx-h100", num_nodes=nodes)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    space = enumerate_space(model, training, cluster.num_gpus)
    mask = runnable_mask(Target.MESHPLAN, space, model, training)
    rows = np.random.default_rng(0).choice(len(space), min(400, len(space)), replace=False)
    for i in rows:
        refused = why_not(Target.MESHPLAN, model, training, space.plan(int(i))) is not None
        assert refused == (not mask[i]), space.plan(int(i)).notation()


def test_a_plan_file_names_only_the_stacks_of_target():
    """plan/job.py cannot import targets.py (a layer above it): its list is the enum's values."""
    from meshplan.plan.job import TARGET_STACKS

    assert TARGET_STACKS == tuple(t.value for t in Target)


def test_a_plan_file_with_an_unknown_target_is_refused_when_read(tmp_path):
    """Before, export and train --dry-run used such a file; estimate refused it."""
    import json

    from meshplan.errors import MeshplanError
    from meshplan.plan import ParallelDims, Plan

    job = Job(model=model_preset("gpt2"), training=TrainingSpec(seq_len=1024, global_batch=32),
              cluster=system_preset("dgx-h100"), plan=Plan(dims=ParallelDims(dp_replicate=8)), target="megatron")
    data = job.to_dict()
    assert Job.from_dict(data).target == "megatron"
    with pytest.raises(MeshplanError, match="target 'nosuch' is not one of meshplan, megatron"):
        Job.from_dict({**data, "target": "nosuch"})
    (tmp_path / "j.json").write_text(json.dumps({**data, "target": "Megatron"}))
    with pytest.raises(MeshplanError, match="not one of"):
        Job.load(tmp_path / "j.json")
