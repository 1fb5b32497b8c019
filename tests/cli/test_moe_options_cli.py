"""`--moe-dispatcher` and `--moe-capacity-factor`, and the two memory numbers, through the real
entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
QWEN = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "16",
        "--dp-shard", "16", "--zero", "1", "--ep", "16", "--seq-len", "4096", "--global-batch", "256"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_dispatchers_and_two_memory_numbers():
    out = {}
    for dispatcher in ("alltoall", "flex"):
        r = run(*QWEN, "--moe-dispatcher", dispatcher, "--json")
        assert r.returncode == 0, r.stderr
        out[dispatcher] = json.loads(r.stdout)
    # ep 16 spans two 8-GPU nodes: DeepEP sends fewer copies over the NICs
    assert out["flex"]["step_time_s"] < out["alltoall"]["step_time_s"]
    d = out["alltoall"]
    assert d["peak_allocated_gib"] < d["peak_reserved_gib"] == d["peak_memory_gib"]


def test_bad_capacity_factor_is_one_line_exit_2():
    r = run(*QWEN, "--moe-capacity-factor", "-1")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "moe_capacity_factor" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
