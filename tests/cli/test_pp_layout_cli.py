"""Through the real entry point: `--stage-layers` takes a Megatron pipeline layout string
(meshplan.plan.layout), the estimate runs it, and a malformed one is one line, exit code 2."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import parse_layout

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK_PP16 = ["--model", "deepseek-v3", "--gpu", "b200", "--gpus", "256", "--pp", "16", "--ep", "8",
                 "--zero", "1", "--seq-len", "4096", "--global-batch", "2048"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_megatron_layout_is_a_stage_split():
    even = json.loads(run("estimate", *DEEPSEEK_PP16, "--json").stdout)
    r = run("estimate", *DEEPSEEK_PP16, "--stage-layers", "Et*4|(t*4|)*14tmL", "--json")
    assert r.returncode == 0, r.stderr
    layout = json.loads(r.stdout)
    assert [s["layers"] for s in layout["stages"]] == [4] * 15 + [1]
    assert layout["step_time_s"] < even["step_time_s"]
    moved = run("estimate", *DEEPSEEK_PP16, "--stage-layers", "Et*4|(t*4|)*13t*5m|L", "--json")
    assert moved.returncode == 0, moved.stderr
    assert "mtp=14" in json.loads(moved.stdout)["plan"]


@pytest.mark.parametrize("layout,message", [
    ("Et*4|(t*4|)*14tmX", "'X' is not a stage separator"),
    ("Et*4|(t*4|)*13t*5m|tL", "transformer layers after the MTP modules"),
    ("Et*4|(t*4|)*14t|mL", "stage_layers has 17 entries"),
])
def test_a_malformed_layout_is_one_line_and_exit_2(layout, message):
    r = run("estimate", *DEEPSEEK_PP16, "--stage-layers", layout)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("stage_layers,mtp_stage", [((4,) * 15 + (1,), None), ((4,) * 14 + (5, 0), 14)])
def test_flags_for_a_layout_plan_build_it_back(stage_layers, mtp_stage):
    from meshplan.cli.plan_flags import build_plan, flags_for, plan_argv
    from meshplan.plan import ParallelDims, Plan

    plan = Plan(dims=ParallelDims(dp_shard=16, pp=16, ep=8), zero=1, stage_layers=stage_layers, mtp_stage=mtp_stage)
    assert build_plan(256, flags_for(plan)) == plan
    line = plan_argv(plan)
    assert ("|" in line) == (mtp_stage is not None)  # a moved MTP module needs the layout
    assert ("'" in line) == (mtp_stage is not None)  # shell-quoted: '|' is the shell's pipe
    if mtp_stage is not None:
        argv = shlex.split(line)
        assert parse_layout(argv[argv.index("--stage-layers") + 1]).mtp_stage == mtp_stage
