"""Through the real entry point: the flags `meshplan plan` prints for a plan, given to
`meshplan estimate`, reproduce that plan, its step time and its memory (issue 12, item 9)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_plan_case() -> list[str]:
    """The job flags of the README's `meshplan plan --model llama3-70b ...` command (its output
    flags, --plot and --out, left out): the README is where the case is written."""
    lines = README.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("meshplan plan --model llama3-70b "))
    command = lines[start]
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + lines[start]
    argv = shlex.split(command)[2:]
    for flag in ("--plot", "--out"):
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    return argv


README_CASE = readme_plan_case()


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_readme_frontier_rows_are_distinct_and_typed_back():
    r = run("plan", *README_CASE, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["frontier"]
    notations = [row["plan"] for row in rows]
    assert len(set(notations)) == len(notations)  # rows 14 and 16 used to print the same
    rec = json.loads(r.stdout)["recommended"]
    uneven = next(i for i, row in enumerate(rows) if "layers=" in row["plan"])
    for i in {rec, uneven, 0}:
        row = rows[i]
        e = run("estimate", *README_CASE, *shlex.split(row["flags"]), "--json")
        assert e.returncode == 0, (row["flags"], e.stderr)
        est = json.loads(e.stdout)
        assert est["plan"] == row["plan"]
        assert abs(est["step_time_s"] - row["step_time_s"]) <= 1e-9 * row["step_time_s"]
        # the frontier's memory is the figure "fits" compares (held peak + CUDA context, NCCL)
        assert abs(est["fit_memory_gib"] - row["fit_memory_gib"]) <= 1e-9 * row["fit_memory_gib"]


@pytest.mark.parametrize("target, said", [((), r"For the job below it recommends `([^`]+)`"),
                                          (("--target", "megatron"),
                                           r"with `--target megatron` it recommends `([^`]+)`")])
def test_readme_states_the_plan_that_plan_recommends(target, said):
    """The README's recommendations are what `meshplan plan` prints for its command, not a copy
    that drifts when the cost model moves."""
    r = run("plan", *README_CASE, *target, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    written = re.search(said, " ".join(README.read_text().split()))
    assert written, said
    assert written.group(1) == out["frontier"][out["recommended"]]["plan"]


def test_printed_recommendation_gives_its_flags():
    r = run("plan", *README_CASE, "--top", "3")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("as flags"))
    assert "--dp " in line and "--tp " in line
    rec_plan = next(x for x in r.stdout.splitlines() if x.startswith("recommended"))
    assert (" pp1 " in rec_plan) != ("--pp " in line)  # pipeline flags exactly when it pipelines
    # a ragged split is printed as the flag that reproduces it (which split wins is the fitted
    # model's call; the preference for even splits within the band is tests/planner/test_robust_choice.py's)
    rec = next(x for x in r.stdout.splitlines() if x.startswith("recommended"))
    assert (" layers=" in rec) == ("--stage-layers" in line)


def test_hsdp_notation_is_accepted_as_flags():
    """`dp16 zero2x2`-style rows: --dp is the total, --dp-shard the sharded part."""
    e = run("estimate", *README_CASE, "--dp", "32", "--dp-shard", "2", "--zero", "2", "--tp", "2", "--pp", "8",
            "--cp", "2", "--vpp", "8", "--json")
    assert e.returncode == 0, e.stderr
    out = json.loads(e.stdout)
    assert out["plan"] == "dp32 zero2x2 tp2sp pp8(interleaved-1f1b,v8) cp2 mb1"
    assert out["flags"] == "--dp 32 --dp-shard 2 --tp 2 --pp 8 --cp 2 --zero 2 --vpp 8"


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_readme_plan_for_a_target_is_exported_by_it(target, tmp_path):
    """Issue 15 item 2: `plan --target X --out f` then `export f --to X` writes the plan; before,
    `--target megatron` recommended `dp256 fsdp64 tp4sp ...`, which the Megatron exporter refused
    ("FSDP ... without replication")."""
    out = tmp_path / "plan.json"
    r = run("plan", *README_CASE, "--target", target, "--out", str(out))
    assert r.returncode == 0, r.stderr
    e = run("export", str(out), "--to", target)
    assert e.returncode == 0, e.stderr


def test_export_best_writes_the_plan_that_plan_recommends(tmp_path):
    """`export --best --to megatron` wrote the fastest fitting plan (ckpt=full:19, 78.7 of 79.7 GiB)
    and called it "the recommended plan" while `plan --target megatron` recommended another
    (ckpt=full:26, which keeps the memory headroom): one recommendation for both."""
    out = tmp_path / "plan.json"
    r = run("plan", *README_CASE, "--target", "megatron", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    e = run("export", str(out), "--to", "megatron", "--best", "--json")
    assert e.returncode == 0, e.stderr
    best = json.loads(e.stdout)["best"]
    assert best["plan"] == planned["frontier"][planned["recommended"]]["plan"]
    assert best["summary"].endswith("the recommended plan")
