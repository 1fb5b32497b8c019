"""`meshplan train` refuses a pipeline plan torch cannot run, in one line, before torchrun starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"


def run_train(plan_file: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(plan_file), "--steps", "1"],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("plan", "global_batch", "message"),
    [
        (Plan(dims=ParallelDims(pp=2), schedule="zero-bubble", recompute="full"), 4,
         "zero-bubble with recompute is not supported"),
        (Plan(dims=ParallelDims(pp=4), schedule="1f1b"), 2, "needs at least 4 micro-batches"),
    ],
)
def test_train_refuses_unrunnable_pipeline_plans(tmp_path: Path, plan: Plan, global_batch: int,
                                                 message: str) -> None:
    job = Job(model=resolve_model("toy-llama", {}), training=TrainingSpec(seq_len=8, global_batch=global_batch),
              cluster=resolve_cluster("cpu", gpus=plan.dims.world_size), plan=plan)
    job.save(tmp_path / "plan.json")
    proc = run_train(tmp_path / "plan.json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert message in out
    assert "Traceback" not in out and "torch.distributed.run" not in out
