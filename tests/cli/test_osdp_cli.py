"""OSDP flags (``--keep-gathered --mlp-splits --head-splits``) through the real entry point (issue 17.2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--seq-len", "8192", "--global-batch", "32"]
OSDP = ["--zero", "3", "--keep-gathered", "attention", "--mlp-splits", "4", "--head-splits", "8"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_estimate_osdp_json_breaks_it_down():
    r = run("estimate", *JOB, *OSDP, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["plan"].endswith("keep=attention split=mlp4,head8")
    assert d["time_s"]["osdp_compute"] > 0 and d["time_s"]["osdp_gather_latency"] > 0
    mem = d["osdp_memory_gib"]
    assert mem["kept_gathered"] > 0 and mem["gathered_buffer"] > 0 and mem["logits"] > 0
    assert "--keep-gathered attention --mlp-splits 4 --head-splits 8" in d["flags"]


def test_estimate_table_shows_osdp_rows():
    r = run("estimate", *JOB, *OSDP)
    assert r.returncode == 0, r.stderr
    assert "of which OSDP splits" in r.stdout and "kept gathered (OSDP)" in r.stdout


def test_bad_osdp_is_one_line_exit_2():
    for extra, needle in ((["--zero", "3", "--keep-gathered", "router"], "'router' is not one of"),
                          (["--zero", "2", "--keep-gathered", "attention"], "needs zero 3"),
                          (["--zero", "3", "--mlp-splits", "3"], "not divisible"),
                          (["--head-splits", "0"], "--head-splits must be a positive integer")):
        r = run("estimate", *JOB, *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
