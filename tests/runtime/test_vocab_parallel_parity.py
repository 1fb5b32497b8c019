"""Vocabulary parallelism over the pipeline ranks (runtime/vocab_parallel.py): loss and final
weights of pp2 (GPipe and 1F1B, tied and untied heads), pp2 x dp2 (ZeRO-3 and ZeRO-1 through FSDP2,
ZeRO-0 replicated) and pp2 x cp2 equal one process (CPU, gloo).

The embedding and the LM head sit on both pipeline ranks, half the vocabulary each; the loss is
the distributed cross-entropy of Yeung et al. 2024 (Sec. 3.1). The final weights are gathered
under the whole model's names, so a shard that held wrong rows or missed a gradient shows up.
"""

from __future__ import annotations

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster

from meshplan.runtime.testing import parity_errors, run_jobs, single_process

from _configs import LR, STEPS, make_job

pytestmark = pytest.mark.runtime

GPIPE = dict(schedule="gpipe", vocab_parallel=True)
VOCAB = dict(schedule="1f1b", vocab_parallel=True)
LAYOUTS_2 = {
    "pp2_gpt_tied_gpipe": ("gpt", dict(dims=dict(pp=2), micro_batch=2, **GPIPE)),  # 4 micro-batches
    "pp2_gpt_tied": ("gpt", dict(dims=dict(pp=2), micro_batch=2, **VOCAB)),
    "pp2_llama_untied": ("llama", dict(dims=dict(pp=2), micro_batch=4, **VOCAB)),
}
LAYOUTS_4 = {
    "pp2_fsdp2_zero3_gpt_tied": ("gpt", dict(dims=dict(pp=2, dp_shard=2), zero=3, micro_batch=2, **VOCAB)),
    "pp2_zero1_llama": ("llama", dict(dims=dict(pp=2, dp_shard=2), zero=1, micro_batch=2, **VOCAB)),
    "pp2_dp2_llama_gpipe": ("llama", dict(dims=dict(pp=2, dp_replicate=2), micro_batch=2, **GPIPE)),  # zero 0
    "pp2_cp2_gpt_tied": ("gpt", dict(dims=dict(pp=2, cp=2), cp_method="all-to-all", micro_batch=2, **VOCAB)),
}


FOUR_LAYERS = {"pp4_llama4": ("llama", dict(dims=dict(pp=4), micro_batch=1, **VOCAB))}
"""A 4-layer Llama on 4 stages: the 1F1B output passes of every lag (2, 1, 1, 0)."""


def _job(model: str, fields: dict, layers: int | None = None):
    if not layers:
        return make_job(model, **dict(fields))
    base = make_job(model)  # the Job checks its plan against the model: swap both at once
    return Job(model=base.model.with_overrides({"num_layers": layers}), training=base.training,
               cluster=resolve_cluster("cpu", gpus=4), plan=Plan(dims=ParallelDims(**fields["dims"]),
               **{k: v for k, v in fields.items() if k != "dims"}))


def _run(layouts, tmp_path_factory, name, layers: int | None = None):
    jobs = [_job(model, fields, layers) for model, fields in layouts.values()]
    return dict(zip(layouts, run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp(name))))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    models = ("llama", "gpt")
    jobs = [single_process(make_job(m)) for m in models]
    return dict(zip(models, run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp("ref"))))


@pytest.fixture(scope="module")
def results_2(tmp_path_factory):
    return _run(LAYOUTS_2, tmp_path_factory, "w2")


@pytest.fixture(scope="module")
def results_4(tmp_path_factory):
    return _run(LAYOUTS_4, tmp_path_factory, "w4")


def _check(name, layouts, results, references):
    got, ref = results[name], references[layouts[name][0]]
    assert len(got.losses) == STEPS
    errors = parity_errors(got, ref)
    assert not errors, f"{name}: " + "; ".join(errors[:5])


@pytest.mark.parametrize("name", LAYOUTS_2)
def test_vocab_parallel_pp2_matches_one_process(name, results_2, references):
    _check(name, LAYOUTS_2, results_2, references)


@pytest.mark.parametrize("name", LAYOUTS_4)
def test_vocab_parallel_pp2_dp2_matches_one_process(name, results_4, references):
    _check(name, LAYOUTS_4, results_4, references)


def test_vocab_parallel_parity_is_not_vacuous(results_2, references):
    """The other model's reference fails the check, and training moved the weights."""
    assert parity_errors(results_2["pp2_gpt_tied"], references["llama"])
    got = results_2["pp2_llama_untied"]
    assert got.losses[0] != got.losses[-1]


CLIP = 0.05
"""Small enough that every step clips: the global norm must count each shard's rows once."""


def _train(job, tmp_path, name: str, *, steps: int, **cfg) -> list[dict]:
    import json
    from pathlib import Path

    from meshplan.runtime.launch import launch
    from meshplan.runtime.train_config import TrainConfig

    log = Path(tmp_path) / f"{name}.jsonl"
    config = TrainConfig(steps=steps, lr=LR, progress=False, log_path=str(log), **cfg)
    launch([(job, config)], timeout_s=600, capture=True)
    return [r for r in map(json.loads, log.read_text().splitlines()) if not r.get("summary")]


def test_vocab_parallel_clips_and_resumes_like_one_process(tmp_path):
    """Global-norm clipping over the stages and the vocabulary shards, and a sharded checkpoint
    of the shards: 2 steps, resume, 2 more equal 4 steps of one process."""
    job = make_job("llama", dims=dict(pp=2), micro_batch=2, **VOCAB)
    ref = _train(single_process(job), tmp_path, "ref", steps=4, clip_grad=CLIP)
    ckpt = str(tmp_path / "ckpt")
    first = _train(job, tmp_path, "a", steps=2, clip_grad=CLIP, checkpoint_dir=ckpt, checkpoint_every=2)
    rest = _train(job, tmp_path, "b", steps=4, clip_grad=CLIP, checkpoint_dir=ckpt, resume=True)
    got = first + rest
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(got, ref):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * b["loss"], (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * b["grad_norm"], (a["step"], a["grad_norm"], b["grad_norm"])
    assert all(r["grad_norm"] > CLIP for r in ref)  # clipping was active


def test_vocab_parallel_pp4_1f1b_matches_one_process(tmp_path_factory):
    got = _run(FOUR_LAYERS, tmp_path_factory, "pp4", layers=4)["pp4_llama4"]
    ref_job = single_process(_job(*FOUR_LAYERS["pp4_llama4"], layers=4))
    ref = run_jobs([ref_job], steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp("ref4"))[0]
    errors = parity_errors(got, ref)
    assert not errors, "pp4_llama4: " + "; ".join(errors[:5])
