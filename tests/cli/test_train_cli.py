"""`meshplan train` through the real entry point: refusals before launch, and the end-to-end run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"
STEP_FIELDS = {"step", "loss", "step_time_s", "tokens_per_s", "peak_memory_gib"}


def meshplan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _job_file(tmp_path: Path, model: str = "toy-llama", **plan_fields) -> Path:
    dims = ParallelDims(**plan_fields.pop("dims", {}))
    job = Job(model=model_preset(model), training=TrainingSpec(seq_len=32, global_batch=8),
              cluster=resolve_cluster("cpu", gpus=dims.world_size), plan=Plan(dims=dims, **plan_fields))
    path = tmp_path / "job.json"
    job.save(path)
    return path


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_missing_plan_file(tmp_path):
    line = _one_error_line(meshplan("train", "--plan", str(tmp_path / "nope.json")))
    assert "no such plan file" in line


def test_encoder_model_is_refused_before_launch(tmp_path):
    path = _job_file(tmp_path, model="bert-large")
    assert "decoder models only" in _one_error_line(meshplan("train", "--plan", str(path)))


def test_moe_with_sequence_parallel_is_refused_before_launch(tmp_path):
    path = _job_file(tmp_path, model="toy-moe", dims=dict(tp=2), sp=True)
    assert "MoE with tensor + sequence parallel" in _one_error_line(meshplan("train", "--plan", str(path)))


@pytest.mark.parametrize("model,feature", [
    ("nemotron-3-nano", "hybrid Mamba-2 layers"), ("gpt-oss-20b", "sliding-window attention"),
    ("deepseek-v3", "multi-token prediction"), ("nemotron-3-super", "hybrid Mamba-2 layers"),
])
def test_planner_only_architectures_are_refused_in_one_line(tmp_path, model, feature):
    line = _one_error_line(meshplan("train", "--plan", str(_job_file(tmp_path, model=model))))
    assert feature in line and "planner-only" in line


def test_mla_with_sequence_parallel_is_refused_before_launch(tmp_path):
    path = _job_file(tmp_path, model="toy-mla", dims=dict(tp=2), sp=True)
    assert "latent attention with sequence parallel" in _one_error_line(meshplan("train", "--plan", str(path)))


def test_override_that_breaks_the_plan_names_it(tmp_path):
    path = _job_file(tmp_path, dims=dict(tp=2))
    line = _one_error_line(meshplan("train", "--plan", str(path), "--override", "num_heads=3,num_kv_heads=3,hidden_size=48"))
    assert "tp=2" in line


def test_missing_data_file(tmp_path):
    path = _job_file(tmp_path)
    assert "no such data file" in _one_error_line(meshplan("train", "--plan", str(path), "--data", str(tmp_path / "x.txt")))


def test_text_data_needs_a_byte_vocabulary(tmp_path):
    path = _job_file(tmp_path)
    line = _one_error_line(meshplan("train", "--plan", str(path), "--data", "sample", "--override", "vocab_size=128"))
    assert "vocab_size >= 256" in line


@pytest.mark.runtime
def test_end_to_end_plan_then_train_on_sample_text(tmp_path):
    """The README's two commands: plan a tiny preset for 4 CPU processes, train it on the sample text."""
    plan_path, log = tmp_path / "plan.json", tmp_path / "train.jsonl"
    out = meshplan("plan", "--model", "toy-llama", "--override", "num_layers=2", "--cluster", "cpu",
                   "--gpus", "4", "--seq-len", "64", "--global-batch", "8", "--precision", "fp32",
                   "--out", str(plan_path), "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    assert Job.load(plan_path).plan.dims.world_size == 4
    out = meshplan("train", "--plan", str(plan_path), "--steps", "15", "--data", "sample", "--lr", "3e-3",
                   "--log", str(log), "--json", timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    steps, summary = lines[:-1], lines[-1]
    assert [s["step"] for s in steps] == list(range(1, 16))
    assert all(STEP_FIELDS <= set(s) for s in steps)
    assert summary["summary"] is True and summary["world_size"] == 4
    first = sum(s["loss"] for s in steps[:3]) / 3
    last = sum(s["loss"] for s in steps[-3:]) / 3
    assert last < first - 0.5, (first, last)  # bytes of English: the model learns letter statistics fast
    assert json.loads(out.stdout)["final_loss"] == pytest.approx(steps[-1]["loss"])
