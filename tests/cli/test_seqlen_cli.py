"""`--seq-len-dist`, `--doc-balance`, `--cp-buckets` on estimate and plan, through the real entry
point: the answers change for skewed data, a Job file carries the distribution, bad files are one
line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
EST = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "8", "--cp", "2",
       "--seq-len", "8192", "--global-batch", "64"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture
def skewed(tmp_path) -> Path:
    p = tmp_path / "lengths.csv"
    p.write_text("length,count\n256,3000\n1024,800\n32768,12\n")
    return p


def test_estimate_changes_for_skewed_data(skewed):
    plain = json.loads(run(*EST, "--json").stdout)
    r = run(*EST, "--seq-len-dist", str(skewed), "--doc-balance", "balanced", "--cp-buckets", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    data = out["data_aware"]
    assert out["step_time_s"] < plain["step_time_s"]
    assert data["full_sequences_step_s"] == pytest.approx(plain["step_time_s"])
    assert data["chosen_step_s"] == pytest.approx(out["step_time_s"]) == pytest.approx(data["aware_step_s"])
    assert data["gain_over_fixed"] > 0 and data["straggler_s"] >= 0
    assert "data_aware" not in plain
    table = run(*EST, "--seq-len-dist", str(skewed))
    assert table.returncode == 0 and "Packed documents (lengths.csv" in table.stdout


def test_plan_writes_a_job_that_estimate_reads_back(skewed, tmp_path):
    job = tmp_path / "job.json"
    r = run("plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2", "--seq-len", "8192",
            "--global-batch", "64", "--seq-len-dist", str(skewed), "--doc-balance", "balanced",
            "--out", str(job), "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    assert planned["data_aware"]["aware_step_s"] <= planned["data_aware"]["fixed_step_s"]
    training = json.loads(job.read_text())["training"]
    assert training["doc_balance"] == "balanced" and training["seq_len_dist"]["source"] == "lengths.csv"
    again = json.loads(run("estimate", "--plan", str(job), "--json").stdout)
    assert again["data_aware"]["chosen_step_s"] == pytest.approx(again["step_time_s"])
    # the data flags apply to a Job's training: stream order is slower here than balanced
    stream = json.loads(run("estimate", "--plan", str(job), "--doc-balance", "stream", "--json").stdout)
    assert stream["step_time_s"] >= again["step_time_s"]


@pytest.mark.parametrize("content, flags, expect", [
    ("length,count\n100,abc\n", [], "document count 'abc' is not an integer"),
    ("12\n0\n", [], "document length must be a positive integer"),
    (None, [], "no such sequence-length distribution"),
    ("length,count\n100,2\n", ["--doc-balance", "sorted"], "--doc-balance"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, content, flags, expect):
    p = tmp_path / "bad.csv"
    if content is not None:
        p.write_text(content)
    r = run(*EST, "--seq-len-dist", str(p), *flags)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and expect in r.stderr
    assert len(lines) == 1 or expect == "--doc-balance"  # typer's usage box for a bad choice


def test_balance_without_distribution_is_refused():
    r = run(*EST, "--doc-balance", "balanced")
    assert r.returncode == 2 and "need a sequence-length distribution" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
