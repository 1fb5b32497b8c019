"""`meshplan estimate` through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


LLAMA70 = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "64", "--tp", "8", "--pp", "4",
           "--seq-len", "8192", "--global-batch", "1024"]


def test_estimate_json_llama3_70b_is_sensible():
    r = run("estimate", *LLAMA70, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
              "peak_memory_gib", "fits", "memory_gib", "time_s"):
        assert k in d
    assert set(d["memory_gib"]) >= {"parameters", "gradients", "optimizer", "activations", "other"}
    assert set(d["time_s"]) >= {"compute", "exposed_communication", "bubble", "optimizer"}
    # published: ~40% MFU for Llama-3 70B on H100 (torchtitan), 38-43% for 405B (Meta)
    assert 0.30 <= d["mfu"] <= 0.55
    assert d["fits"] is True
    assert d["plan"].startswith("dp16 tp8sp pp4")
    assert len(d["stages"]) == 4


def test_estimate_tables_and_not_fitting_plan():
    r = run("estimate", "--model", "llama3-70b", "--gpu", "a100-40gb", "--nodes", "1", "--tp", "8",
            "--seq-len", "4096", "--global-batch", "8")
    assert r.returncode == 0, r.stderr
    assert "NO, short by" in r.stdout and "Step time breakdown" in r.stdout
    j = json.loads(run("estimate", "--model", "llama3-70b", "--gpu", "a100-40gb", "--nodes", "1", "--tp", "8",
                       "--seq-len", "4096", "--global-batch", "8", "--json").stdout)
    assert j["fits"] is False and j["memory_shortfall_gib"] > 0


def test_estimate_from_plan_file_matches_flags(tmp_path):
    from meshplan.plan import Job, ParallelDims, Plan
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    job = Job(model=model_preset("llama3-8b"), training=TrainingSpec(seq_len=2048, global_batch=64),
              cluster=system_preset("dgx-h100", 2),
              plan=Plan(dims=ParallelDims(dp_shard=8, tp=2), zero=3, sp=True, micro_batch=2))
    path = tmp_path / "plan.json"
    job.save(path)
    a = json.loads(run("estimate", "--plan", str(path), "--json").stdout)
    b = json.loads(run("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
                       "--tp", "2", "--zero", "3", "--micro-batch", "2", "--seq-len", "2048",
                       "--global-batch", "64", "--json").stdout)
    assert a["step_time_s"] == pytest.approx(b["step_time_s"])
    assert a["plan"] == b["plan"]


@pytest.mark.parametrize("args,needle", [
    (["--model", "no-such-model", "--cluster", "dgx-h100", "--global-batch", "8"], "no-such-model"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "3", "--dp", "1", "--global-batch", "8",
      "--nodes", "1", "--pp", "1", "--cp", "1"], "tp"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "0", "--global-batch", "8"], "tp"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "-4"], "global_batch"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "0", "--global-batch", "8"], "num_nodes"),
    (["--model", "llama3-8b", "--cluster", "no-such-cluster", "--global-batch", "8"], "no-such-cluster"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run("estimate", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_heads_not_divisible_by_tp(tmp_path):
    r = run("estimate", "--model", "gpt2-xl", "--cluster", "dgx-h100", "--tp", "2", "--seq-len", "1024", "--global-batch", "8")
    assert r.returncode == 2 and "num_heads=25 is not divisible by tp=2" in r.stderr


def test_malformed_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    r = run("estimate", "--model", str(bad), "--cluster", "dgx-h100", "--global-batch", "8")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_estimate_takes_gpus_as_plan_does():
    """`--gpus 512` sizes the cluster as `--nodes 64` of 8 does; a count that disagrees with
    --nodes, or is not whole nodes, is one line and exit code 2."""
    by_nodes = json.loads(run("estimate", *LLAMA70, "--json").stdout)
    args = [a for a in LLAMA70 if a not in ("--nodes", "64")]
    by_gpus = run("estimate", *args, "--gpus", "512", "--json")
    assert by_gpus.returncode == 0, by_gpus.stderr
    assert json.loads(by_gpus.stdout)["step_time_s"] == by_nodes["step_time_s"]
    for bad in (["--gpus", "256", "--nodes", "64"], ["--gpus", "500"]):
        r = run("estimate", *args, *bad)
        assert r.returncode == 2 and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
