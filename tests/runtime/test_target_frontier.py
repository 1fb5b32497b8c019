"""Every frontier point that `meshplan plan --target meshplan` writes is one `meshplan train` runs
(issue 15 item 2): for toy-llama and toy-moe on 4 CPU processes, each point is written with
``plan --pick N --out`` (the CLI, in process) and all of them train one step in one launch (the
launcher and `train` that `meshplan train` uses; one launch pays the torch import and rendezvous
once). A plan the runtime refused would fail the launch naming it."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from meshplan.cli import commands  # noqa: F401  (registers the commands on the app)
from meshplan.cli.main import app
from meshplan.plan import Job
from meshplan.runtime.testing import run_jobs

SETTINGS = ("--cluster", "cpu", "--gpus", "4", "--seq-len", "32", "--global-batch", "4", "--target", "meshplan")


def _frontier_jobs(model: str, tmp_path) -> list[Job]:
    runner = CliRunner()
    listed = runner.invoke(app, ["plan", "--model", model, *SETTINGS, "--top", "0", "--json"])
    assert listed.exit_code == 0, listed.output
    n = len(json.loads(listed.stdout)["frontier"])
    assert n >= 5  # a real frontier: several layouts, not one point
    jobs = []
    for i in range(n):
        out = tmp_path / f"{model}-{i}.json"
        r = runner.invoke(app, ["plan", "--model", model, *SETTINGS, "--pick", str(i), "--out", str(out), "--json"])
        assert r.exit_code == 0, r.output
        jobs.append(Job.load(out))
    return jobs


@pytest.mark.timeout(600)
def test_every_frontier_point_trains(tmp_path):
    moe = _frontier_jobs("toy-moe", tmp_path)
    jobs = _frontier_jobs("toy-llama", tmp_path) + moe
    layouts = {j.plan.notation() for j in jobs}
    assert any(j.plan.dims.pp > 1 for j in jobs) and any(j.plan.dims.tp > 1 for j in jobs)
    assert any(j.plan.dims.ep > 1 for j in moe)  # the MoE frontier exercises expert parallel
    results = run_jobs(jobs, steps=1, tmp_path=tmp_path)
    assert len(results) == len(jobs) and len(layouts) > 1
    for job, res in zip(jobs, results):
        assert len(res.losses) == 1 and math.isfinite(res.losses[0]), job.plan.notation()
