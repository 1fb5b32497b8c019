"""Offload parity on CPU (issue 17): parameters+optimizer through FSDP2's CPUOffloadPolicy and
activations through torch's save_on_cpu train to the same losses and weights as one process.

What a CPU-only run cannot show: on CPU the "device" is the host, so the copies these policies
insert move nothing and cost nothing, and pinned memory is off. The test proves the code paths run
(FSDP2 builds its offloaded shards, the optimizer steps on them, the saved-tensor hooks pack and
unpack every saved tensor) and that they do not change the arithmetic; the time and the GPU memory
they save are the cost model's (meshplan.cost.offload), to be measured on a GPU.
"""

from __future__ import annotations

import pytest

from meshplan.errors import MeshplanError
from meshplan.runtime.testing import parity_errors
from meshplan.targets import Target, check_runs

from _configs import layout_runs, make_job

pytestmark = pytest.mark.runtime

LAYOUTS = {
    "fsdp2_offload_params": ("llama", dict(dims=dict(dp_shard=2), zero=3, offload=("optimizer", "params"))),
    "dp2_offload_activations": ("llama", dict(dims=dict(dp_replicate=2), micro_batch=2, offload=("activations",))),
    "fsdp2_offload_all_full_ckpt": ("gpt", dict(dims=dict(dp_shard=2), zero=3, recompute="full",
                                                 offload=("optimizer", "params", "activations"))),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(LAYOUTS, tmp_path_factory, "offload")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_offload_matches_one_process(runs, name):
    got, ref = runs[name]
    assert parity_errors(got, ref) == []


def test_runtime_refuses_optimizer_offload_alone():
    job = make_job("llama", dims=dict(dp_shard=2), zero=2, offload=("optimizer",))
    with pytest.raises(MeshplanError, match="optimizer states alone"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)


def test_runtime_refuses_activation_offload_with_pipeline():
    job = make_job("llama", dims=dict(pp=2), offload=("activations",))
    with pytest.raises(MeshplanError, match="activation offload with pipeline"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)
