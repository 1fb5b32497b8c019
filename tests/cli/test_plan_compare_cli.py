"""`meshplan plan --compare JOB.json` takes its planning options from the Job file (real entry point)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "mine.json"
    Job(model=model_preset("gpt2"),
        training=TrainingSpec(seq_len=1024, global_batch=32, precision=Precision.FP16),
        cluster=resolve_cluster(None, gpu="a100-80gb", gpus_per_node=4, gpus=4),
        plan=Plan(dims=ParallelDims(tp=2, pp=2), micro_batch=1)).save(path)
    return path


def test_compare_alone_plans_for_the_job_files_setting(mine):
    alone = run("plan", "--compare", str(mine), "--json")
    assert alone.returncode == 0, alone.stderr
    full = run("plan", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus-per-node", "4", "--gpus", "4",
               "--seq-len", "1024", "--global-batch", "32", "--precision", "fp16", "--compare", str(mine), "--json")
    assert full.returncode == 0, full.stderr
    a, f = json.loads(alone.stdout), json.loads(full.stdout)
    assert a["num_gpus"] == 4 and a["comparison"]["yours"]["plan"] == "dp1 tp2 pp2(1f1b) cp1 mb1"
    # same search as with every option spelled out (search timings aside)
    assert [p["plan"] for p in a["frontier"]] == [p["plan"] for p in f["frontier"]]
    assert [p["step_time_s"] for p in a["frontier"]] == [p["step_time_s"] for p in f["frontier"]]
    assert a["comparison"] == f["comparison"]


def test_explicit_options_win_over_the_job_file(mine):
    # a different global batch than the Job's: the comparison refuses to mix the two settings
    r = run("plan", "--compare", str(mine), "--global-batch", "64")
    assert r.returncode == 2 and "seq 1024 x batch 32" in r.stderr
    # GPU counts given: the search runs on 4 and 8 of the Job's hardware, compared at its 4
    r = run("plan", "--compare", str(mine), "--gpus", "4,8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [c["num_gpus"] for c in out["counts"]] == [4, 8]
    assert out["comparison"]["yours"]["plan"] == "dp1 tp2 pp2(1f1b) cp1 mb1"


def test_model_is_required_without_compare():
    r = run("plan", "--gpu", "a100-80gb", "--global-batch", "32")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--model" in r.stderr


def test_compare_explains_the_gap_in_named_terms(mine):
    """The attribution's rows add up to the step-time gap between yours and the recommended plan,
    and the table names the terms."""
    r = run("plan", "--compare", str(mine), "--json")
    assert r.returncode == 0, r.stderr
    cmp = json.loads(r.stdout)["comparison"]
    att = cmp["attribution"]
    names = {t["term"] for t in att["terms"]}
    assert {"compute", "recompute", "exposed TP", "exposed PP p2p", "bubble", "optimizer"} <= names
    # against the plan `plan` recommends (robust to the model's error), not the nominally fastest
    out = json.loads(r.stdout)
    assert cmp["recommended"]["plan"] == out["frontier"][out["recommended"]]["plan"]
    gap = cmp["recommended"]["step_time_s"] - cmp["yours"]["step_time_s"]
    assert sum(t["delta_s"] for t in att["terms"]) == pytest.approx(gap, rel=1e-6)
    assert sum(t["yours_s"] for t in att["terms"]) == pytest.approx(cmp["yours"]["step_time_s"], rel=1e-6)
    text = run("plan", "--compare", str(mine))
    assert text.returncode == 0 and "recommended s" in text.stdout and "exposed TP" in text.stdout


def test_compare_holds_the_gain_to_the_models_ratio_error(mine):
    """The comparison carries the model's measured error on the ratio of yours and the recommended
    plan (meshplan.search.robust.band_basis) and says whether the gain is beyond it."""
    r = run("plan", "--compare", str(mine), "--json")
    assert r.returncode == 0, r.stderr
    cmp = json.loads(r.stdout)["comparison"]
    assert 0 < cmp["band"] < 1 and cmp["band_basis"]
    assert cmp["speedup"] > 0  # gpt2 on tp2 pp2 with mb1: the search finds a faster plan
    word = "within" if cmp["speedup"] <= cmp["band"] else "beyond"
    assert f"the gain is {word} the model's error on the ratio of two layouts" in cmp["summary"]
