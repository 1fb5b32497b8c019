"""Pipeline parallel through the runtime's real training loop (``meshplan train``'s worker).

Jobs go through the runtime harness (one torchrun launch for the pipelined jobs, one for their
single-process references), so this covers build_pipeline as train.py calls it: the loss it
logs (averaged over ranks), the optimizer over the stage parameters, and the full-weight gather.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

pytest.importorskip("torch")

from meshplan.plan import Job, ParallelDims, Plan  # noqa: E402
from meshplan.runtime.testing import parity_errors, run_jobs, single_process  # noqa: E402
from meshplan.spec.cluster import resolve_cluster  # noqa: E402
from meshplan.spec.presets import resolve_model  # noqa: E402
from meshplan.spec.training import TrainingSpec  # noqa: E402

SHRINK = {"num_layers": 4, "hidden_size": 32, "vocab_size": 64}
STEPS = 5


def job(preset: str, plan: Plan, global_batch: int) -> Job:
    # SGD keeps weight differences proportional to gradient differences (Adam turns the
    # noise-level gradient of e.g. attention key biases into lr-sized steps).
    training = TrainingSpec(seq_len=8, global_batch=global_batch, optimizer="sgd")
    return Job(model=resolve_model(preset, SHRINK), training=training,
               cluster=resolve_cluster("cpu", gpus=plan.dims.world_size), plan=plan)


JOBS = {
    "gpt-tied pp2(v2 interleaved) x fsdp2 zero3, selective recompute": job(
        "toy-gpt", Plan(dims=ParallelDims(pp=2, dp_shard=2), zero=3, schedule="interleaved-1f1b",
                        vpp=2, recompute="selective"), global_batch=8),
    "llama pp2(1f1b, layers 3+1) x tp2 sp, full recompute": job(
        "toy-llama", Plan(dims=ParallelDims(pp=2, tp=2), sp=True, schedule="1f1b",
                          stage_layers=(3, 1), recompute="full"), global_batch=4),
    "moe pp2(gpipe) x dp2 replicate, micro_batch 2": job(
        "toy-moe", Plan(dims=ParallelDims(pp=2, dp_replicate=2), schedule="gpipe", micro_batch=2),
        global_batch=8),
    # HSDP (replicas x 1 shard) zero 2, 2 micro-batches: shards summed, replicas all-reduced on the
    # last micro-batch only (pipeline.ZeroStage; the count: test_dryrun.py
    # test_pipelined_hsdp_all_reduces_the_replicas_once_per_step)
    "llama pp2(1f1b) x HSDP 2x1 zero2, 2 micro-batches": job(
        "toy-llama", Plan(dims=ParallelDims(pp=2, dp_replicate=2), zero=2, schedule="1f1b"), global_batch=4),
}


def test_pipelined_training_matches_one_process(tmp_path: Path) -> None:
    jobs = list(JOBS.values())
    (tmp_path / "pp").mkdir()
    (tmp_path / "ref").mkdir()
    got = run_jobs(jobs, steps=STEPS, tmp_path=tmp_path / "pp", lr=0.1)
    ref = run_jobs([single_process(j) for j in jobs], steps=STEPS, tmp_path=tmp_path / "ref", lr=0.1)
    failures = {}
    for name, g, r in zip(JOBS, got, ref):
        assert len(g.losses) == STEPS, name
        assert g.losses[-1] != g.losses[0], f"{name}: training did not move"
        errors = parity_errors(g, r)
        if errors:
            failures[name] = errors[:5]
    assert not failures, failures
