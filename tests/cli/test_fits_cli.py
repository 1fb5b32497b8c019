"""One definition of "fits" across `plan` and `estimate`, through the real entry point: the plan
that `plan --memory-gib` writes holds, by `estimate`, at most that much on the device (reserved
peak + CUDA context + NCCL buffers; cost/device_memory.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_planned_job_fits_its_budget_on_the_device(tmp_path):
    job = tmp_path / "job.json"
    r = run("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "1", "--seq-len", "2048",
            "--global-batch", "16", "--memory-gib", "30", "--json", "--out", str(job))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    budget = data["budget_gib"]
    assert budget == 30  # the device peak "fits" reads is compared with the memory itself
    e = run("estimate", "--plan", str(job), "--json")
    assert e.returncode == 0, e.stderr
    est = json.loads(e.stdout)
    assert est["fits"] is True
    assert est["peak_memory_gib"] < budget
    assert est["peak_device_gib"] <= 30


def test_plan_and_estimate_report_allocated_reserved_and_the_headroom_asked(tmp_path):
    """`plan` gives its recommendation's allocated / reserved / device peaks and the headroom the
    observed memory error asks (search/memory_margin.py); `estimate` of the written plan gives the
    same figures, and the fit figure is the frontier's."""
    job = tmp_path / "job.json"
    r = run("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "1", "--seq-len", "2048",
            "--global-batch", "16", "--json", "--out", str(job))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    mem = data["recommended_memory"]
    point = data["frontier"][data["recommended"]]
    assert mem["fit_memory_gib"] == point["fit_memory_gib"]
    assert mem["peak_allocated_gib"] < mem["peak_reserved_gib"] < mem["peak_device_gib"]
    assert mem["fit_with_headroom_gib"] == mem["fit_memory_gib"] * (1 + mem["memory_error_p90"])
    assert mem["keeps_headroom"] == (mem["fit_with_headroom_gib"] <= data["budget_gib"])
    assert mem["memory_error_p90"] == data["robust"]["required_memory_headroom"]
    e = run("estimate", "--plan", str(job), "--json")
    assert e.returncode == 0, e.stderr
    est = json.loads(e.stdout)
    assert est["memory_margin"] == mem
    assert (est["peak_allocated_gib"], est["peak_reserved_gib"]) == (mem["peak_allocated_gib"], mem["peak_reserved_gib"])
    t = run("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "1", "--seq-len", "2048",
            "--global-batch", "16")
    assert t.returncode == 0, t.stderr
    assert "memory per GPU: allocated" in t.stdout and "p90 memory error" in t.stdout
