"""`--offload` through the real entry point (issue 17)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--seq-len", "8192", "--global-batch", "32"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_estimate_offload_json_breaks_it_down():
    r = run("estimate", *JOB, "--zero", "3", "--recompute", "full", "--offload", "optimizer+params", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["plan"].endswith("offload=optimizer+params")
    assert d["fits"] and d["time_s"]["offload"] > 0 and d["memory_gib"]["optimizer"] == 0
    assert 0 < d["host_memory_gib"] <= d["host_memory_budget_gib"]
    assert "--offload optimizer+params" in d["flags"]


def test_estimate_table_shows_offload_row():
    r = run("estimate", *JOB, "--zero", "3", "--offload", "optimizer+params+activations")
    assert r.returncode == 0, r.stderr
    assert "offload (host copies, CPU Adam)" in r.stdout and "host memory (offload)" in r.stdout


def test_bad_offload_is_one_line_exit_2():
    for extra, needle in ((["--offload", "disk"], "'disk' is not one of"),
                          (["--offload", "params"], "needs 'optimizer'"),
                          (["--zero", "2", "--offload", "optimizer+params"], "needs zero 3")):
        r = run("estimate", *JOB, "--zero", "3", *extra) if "--zero" not in extra else run("estimate", *JOB, *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_plan_recommends_offload_for_70b_on_one_node():
    r = run("plan", *JOB, "--json")
    assert r.returncode == 0, r.stderr
    assert "offload=" in r.stdout
