"""Test helper: run Jobs for N steps (one process per rank) and read back losses and final weights.

Reused by the runtime, pipeline and checkpoint tests::

    results = run_jobs([job_a, job_b], steps=5, tmp_path=tmp_path)   # one launch
    ref = run_jobs([single_process(job_a)], steps=5, tmp_path=tmp_path)[0]
    assert_parity(results[0], ref)

Several jobs of one world size share one launch (torch import and rendezvous are paid once).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshplan.plan import Job, ParallelDims, Recompute, Schedule
from meshplan.runtime.launch import launch
from meshplan.runtime.train_config import TrainConfig
from meshplan.spec.cluster import resolve_cluster

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RunResult:
    losses: list[float]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    state: dict[str, Any]
    """Canonical parameter name -> full fp32 tensor after the last step."""


def single_process(job: Job, micro_batch: int | None = None) -> Job:
    """The same model, data and batch on one CPU process, no recompute, one micro-batch unless given
    (the parity reference)."""
    plan = replace(job.plan, dims=ParallelDims(), zero=0, sp=False, vpp=1, stage_layers=(), mtp_stage=None,
                   schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.NONE, recompute_layers=(), recompute_modules=(),
                   micro_batch=micro_batch or job.training.global_batch, offload=(),
                   keep_gathered=(), mlp_splits=1, head_splits=1, vocab_parallel=False)
    return Job(model=job.model, training=job.training, cluster=resolve_cluster("cpu", gpus=1), plan=plan)


def run_jobs(jobs: list[Job], *, steps: int, tmp_path: Path, lr: float = 1e-3, seed: int = 0,
             data: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[RunResult]:
    """Train every job for ``steps`` steps in one launch; return their results in order."""
    import torch

    tmp_path = Path(tmp_path)
    runs = []
    for i, job in enumerate(jobs):
        cfg = TrainConfig(steps=steps, lr=lr, seed=seed, data=data, progress=False,
                          log_path=str(tmp_path / f"run{i}.jsonl"), state_out=str(tmp_path / f"run{i}.pt"))
        runs.append((job, cfg))
    launch(runs, timeout_s=timeout_s, capture=True)
    results = []
    for _, cfg in runs:
        lines = [json.loads(x) for x in Path(cfg.log_path).read_text().splitlines()]
        records = [x for x in lines if not x.get("summary")]
        summary = next((x for x in lines if x.get("summary")), {})
        state = torch.load(cfg.state_out)
        results.append(RunResult([r["loss"] for r in records], records, summary, state))
    return results


def parity_errors(got: RunResult, ref: RunResult, *, loss_rtol: float = 1e-5,
                  weight_atol: float = 1e-5, weight_rtol: float = 1e-4) -> list[str]:
    """Differences between two runs beyond fp32 tolerance (empty list when they agree)."""
    errors = []
    if len(got.losses) != len(ref.losses):
        errors.append(f"{len(got.losses)} steps vs {len(ref.losses)}")
    for i, (a, b) in enumerate(zip(got.losses, ref.losses)):
        if not math.isclose(a, b, rel_tol=loss_rtol):
            errors.append(f"step {i + 1}: loss {a:.8f} vs reference {b:.8f}")
    if set(got.state) != set(ref.state):
        errors.append(f"parameter names differ: {sorted(set(got.state) ^ set(ref.state))[:5]}")
    for name in sorted(set(got.state) & set(ref.state)):
        a, b = got.state[name], ref.state[name]
        if a.shape != b.shape:
            errors.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        diff = (a - b).abs()
        bound = weight_atol + weight_rtol * b.abs()
        if bool((diff > bound).any()):
            errors.append(f"{name}: max |diff| {diff.max().item():.3e}")
    return errors
