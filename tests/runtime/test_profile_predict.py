"""`meshplan train` ends with predicted vs measured and writes both into its JSON log summary."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import Job, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

pytestmark = pytest.mark.runtime
SRC = Path(__file__).resolve().parents[2] / "src"
GOLDEN = Path(__file__).resolve().parents[1] / "planner" / "data" / "hwprofile_small.json"


def _train(tmp_path, *extra):
    job = Job(model=model_preset("toy-gpt"), training=TrainingSpec(seq_len=32, global_batch=4, precision=Precision.FP32),
              cluster=system_preset("cpu").with_gpus(1), plan=Plan(micro_batch=2))
    job.save(tmp_path / "job.json")
    log = tmp_path / "log.jsonl"
    run = subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(tmp_path / "job.json"),
                          "--steps", "3", "--log", str(log), *extra],
                         capture_output=True, text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
                         timeout=240)
    return run, log


def test_train_prints_and_logs_predicted_vs_measured(tmp_path):
    run, log = _train(tmp_path, "--cluster-profile", str(GOLDEN))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Predicted vs measured" in run.stdout and "peak memory (GiB)" in run.stdout
    records = [json.loads(x) for x in log.read_text().splitlines()]
    summary = records[-1]
    assert summary["summary"] is True
    steps = [r["step_time_s"] for r in records[:-1]]
    assert summary["measured_step_time_s"] == sorted(steps[2:])[0]  # 3 steps: 2 warm-up, 1 kept
    assert summary["measured_peak_memory_gib"] == max(r["peak_memory_gib"] for r in records[:-1])
    assert summary["predicted_step_time_s"] > 0
    # the golden profile's 3e8-byte worker baseline is in the prediction
    assert summary["predicted_peak_memory_gib"] > 3e8 / 2**30
    assert summary["step_time_error"] == pytest.approx(
        summary["predicted_step_time_s"] / summary["measured_step_time_s"] - 1)
    assert "profile:hwprofile_small.json" in summary["calibration_source"]


def test_train_refuses_a_bad_profile_before_starting(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    run, _ = _train(tmp_path, "--cluster-profile", str(bad))
    assert run.returncode == 2
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1 and "bad.json" in run.stderr
