"""`meshplan estimate` and `meshplan explain` print the same step-time breakdown (one renderer)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from meshplan.cost import estimate
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"
PARTS = ("compute (incl. recompute)", "of which recompute", "exposed communication", "pipeline bubble", "optimizer")


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _rows(text):
    """part -> (seconds, share) from a rendered breakdown table."""
    out = {}
    for part in PARTS:
        m = re.search(re.escape(part) + r"\s*│\s*([0-9.]+)\s*│\s*([0-9.]+%)", text)
        assert m, (part, text)
        out[part] = m.groups()
    return out


def test_estimate_and_explain_share_the_time_breakdown(tmp_path):
    job = Job(model=model_preset("llama2-7b"), training=TrainingSpec(seq_len=2048, global_batch=64),
              cluster=system_preset("dgx-h100", 1),
              plan=Plan(dims=ParallelDims(dp_shard=2, tp=2, pp=2), zero=1, sp=True, micro_batch=1,
                        recompute="selective"))
    path = tmp_path / "job.json"
    job.save(path)
    a, b = run("estimate", "--plan", str(path)), run("explain", str(path))
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    ra, rb = _rows(a.stdout), _rows(b.stdout)
    assert ra == rb
    est = estimate(job.model, job.cluster, job.training, job.plan)
    assert ra["pipeline bubble"] == (f"{est.time.bubble_s:.3f}", f"{est.time.bubble_s / est.step_time_s:.1%}")
    assert "Step time breakdown (critical path)" in a.stdout and "Time per step (" in b.stdout
