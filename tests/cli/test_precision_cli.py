"""`--precision fp8|fp4 --recipe ...` through the real entry point (estimate, plan, export)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


BASE = ["--model", "llama3-70b", "--cluster", "gb200-nvl72", "--nodes", "16", "--tp", "4", "--pp", "4",
        "--seq-len", "8192", "--global-batch", "256"]


def test_fp4_estimates_faster_than_fp8_with_the_same_mfu_basis():
    out = {}
    for prec in (["--precision", "fp8", "--recipe", "mxfp8"], ["--precision", "fp4"]):
        r = run("estimate", *BASE, *prec, "--json")
        assert r.returncode == 0, r.stderr
        out[prec[1]] = json.loads(r.stdout)
    assert out["fp4"]["step_time_s"] < out["fp8"]["step_time_s"]


@pytest.mark.parametrize("args, needle", [
    (["--cluster", "dgx-h100", "--precision", "fp4"], "h100-sxm"),
    (["--precision", "bf16", "--recipe", "mxfp8"], "needs precision fp8 or fp4"),
    (["--precision", "fp8", "--recipe", "nvfp4"], "is not an fp8 recipe"),
])
def test_bad_precision_is_one_line_exit_2(args, needle):
    base = [a for a in BASE]
    if "--cluster" in args:
        i = base.index("--cluster")
        del base[i:i + 2]
    r = run("estimate", *base, *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_plan_file_carries_the_recipe_to_the_megatron_export(tmp_path):
    out = tmp_path / "p.json"
    r = run("plan", "--model", "llama3-8b", "--cluster", "gb300-nvl72", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--precision", "fp8", "--recipe", "tensorwise", "--top", "3",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["training"]["recipe"] == "tensorwise"
    e = run("export", str(out), "--to", "megatron")
    assert e.returncode == 0, e.stderr
    assert "--fp8-format hybrid --fp8-recipe tensorwise" in e.stdout
