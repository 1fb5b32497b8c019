"""`--target` on estimate, report and export (issue 15 item 2), through the real entry point."""

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
# MoE with tp + sp: meshplan's runtime refuses it (targets.MESHPLAN_RULES), Megatron runs it
MOE_TP_SP = ("--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--nodes", "1", "--tp", "2", "--sp", "--ep", "4",
             "--dp", "4", "--zero", "1", "--global-batch", "32", "--seq-len", "4096")


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_estimate_warns_in_one_line_naming_why():
    r = run("estimate", *MOE_TP_SP, "--target", "meshplan", "--json")
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "meshplan cannot run this plan" in lines[0] and "sequence parallel" in lines[0]
    out = json.loads(r.stdout)
    assert out["target"] == "meshplan" and "sequence parallel" in out["target_refuses"]
    quiet = run("estimate", *MOE_TP_SP, "--target", "megatron", "--json")
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""
    assert json.loads(quiet.stdout)["target_refuses"] is None
    default = run("estimate", *MOE_TP_SP, "--json")  # no --target typed: no warning
    assert default.returncode == 0 and default.stderr.strip() == ""


@pytest.fixture(scope="module")
def refused_job(tmp_path_factory):
    path = tmp_path_factory.mktemp("tgt") / "moe.json"
    Job(model=model_preset("toy-moe"), training=TrainingSpec(seq_len=64, global_batch=8, precision=Precision.FP32),
        cluster=resolve_cluster("cpu", gpus=4),
        plan=Plan(dims=ParallelDims(dp_shard=2, tp=2, ep=2), zero=1, sp=True)).save(path)
    return path


def test_report_warns_when_yours_cannot_run(refused_job, tmp_path):
    r = run("report", "--plan", str(refused_job), "--out", str(tmp_path / "r.html"), "--target", "meshplan", "--json")
    assert r.returncode == 0, r.stderr
    assert "meshplan cannot run this plan" in r.stderr
    out = json.loads(r.stdout)
    assert out["target"] == "meshplan" and "sequence parallel" in out["yours_refused"]
    html = (tmp_path / "r.html").read_text()
    assert 'id="yours-row"' in html and 'id="attribution-table"' in html


def test_export_target_defaults_the_framework(refused_job, tmp_path):
    by_target = run("export", str(refused_job), "--target", "deepspeed", "--json")
    by_to = run("export", str(refused_job), "--to", "deepspeed", "--json")
    assert by_target.returncode == 0, by_target.stderr
    assert json.loads(by_target.stdout)["text"] == json.loads(by_to.stdout)["text"]
    assert json.loads(by_target.stdout)["target"] == "deepspeed"
    bridge = run("export", str(refused_job), "--target", "megatron", "--to", "megatron-bridge", "--json")
    assert bridge.returncode == 0, bridge.stderr


@pytest.mark.parametrize("args,msg", [
    (("--target", "meshplan"), "nothing to export"),
    (("--target", "torchtitan", "--to", "deepspeed"), "not --target torchtitan"),
    ((), "give --to"),
])
def test_export_target_bad_input(refused_job, args, msg):
    r = run("export", str(refused_job), *args)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
