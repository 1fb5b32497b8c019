"""OSDP parity on CPU (issue 17.2): FSDP2 units per operator group with their reshard policy, MLPs
in slices and a chunked LM head + loss train to the same losses and weights as one process.

What a CPU-only run cannot show: the memory OSDP saves (one MLP slice gathered at a time, one
chunk of logits at a time) and the time its extra collectives and smaller GEMMs cost; those are
the cost model's (meshplan.cost.osdp), to be measured on a GPU. The test proves the units are
built with their policies, the slices and chunks compute the whole operator's function, and the
gradients of every slice and chunk reach the right parameters.
"""

from __future__ import annotations

import pytest

from meshplan.errors import MeshplanError
from meshplan.runtime.testing import parity_errors, run_jobs, single_process
from meshplan.targets import Target, check_runs

from _configs import LR, STEPS, make_job

pytestmark = pytest.mark.runtime

LAYOUTS = {
    # attention and the LM head kept gathered, each MLP in 2 slices, the loss over 4 token chunks
    "fsdp2_keep_split_chunk": ("llama", dict(dims=dict(dp_shard=2), zero=3, micro_batch=2,
                                             keep_gathered=("attention", "head"), mlp_splits=2, head_splits=4)),
    # GPT-2 (biases, tied head): MLP kept, embedding kept (tied: stays in the root), 2 chunks
    "fsdp2_keep_mlp_tied": ("gpt", dict(dims=dict(dp_shard=2), zero=3, keep_gathered=("mlp", "embedding"),
                                        head_splits=2)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = [make_job(model, **dict(fields)) for model, fields in LAYOUTS.values()]
    models = sorted({model for model, _ in LAYOUTS.values()})
    refs = run_jobs([single_process(make_job(m)) for m in models], steps=STEPS, lr=LR,
                    tmp_path=tmp_path_factory.mktemp("ref"))
    results = run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp("osdp"))
    ref_of = dict(zip(models, refs))
    return {name: (got, ref_of[LAYOUTS[name][0]]) for name, got in zip(LAYOUTS, results)}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_osdp_matches_one_process(runs, name):
    got, ref = runs[name]
    assert parity_errors(got, ref) == []


def test_runtime_refuses_chunked_head_with_tp():
    job = make_job("llama", dims=dict(tp=2), head_splits=2)
    with pytest.raises(MeshplanError, match="head_splits=2 with tp=2"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)


def test_runtime_refuses_mlp_slices_with_tp():
    job = make_job("llama", dims=dict(tp=2), zero=3, mlp_splits=2)
    with pytest.raises(MeshplanError, match="mlp_splits=2 with tp=2"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)
