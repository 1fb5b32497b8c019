"""`meshplan train` refuses what this machine cannot start, before any worker (issue 12 item 7), and
`meshplan profile --procs N` above the core count warns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.runtime.launch import MAX_PROCS_ENV, MIN_PROCS_CAP, PROCS_PER_CORE, max_cpu_procs
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"


def meshplan(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop(MAX_PROCS_ENV, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _job_file(tmp_path: Path, *, dp_shard: int, cluster: str = "cpu") -> Path:
    dims = ParallelDims(dp_shard=dp_shard)
    gpus = {"gpus": dp_shard} if cluster == "cpu" else {"nodes": max(1, dp_shard // 8)}
    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=32, global_batch=dp_shard),
              cluster=resolve_cluster(cluster, **gpus), plan=Plan(dims=dims, zero=3))
    path = tmp_path / "job.json"
    job.save(path)
    return path


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_gpu_plan_on_a_machine_without_gpus_says_what_to_do(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("this machine has GPUs")
    path = _job_file(tmp_path, dp_shard=1024, cluster="dgx-h100")
    line = _one_error_line(meshplan("train", "--plan", str(path)))
    assert "1024 h100" in line and "no GPU" in line
    assert "--cluster cpu" in line and f"meshplan train --plan {path} --dry-run" in line


def test_cpu_processes_are_capped(tmp_path):
    cap = max(MIN_PROCS_CAP, PROCS_PER_CORE * (os.cpu_count() or 1))
    path = _job_file(tmp_path, dp_shard=2 * cap)
    line = _one_error_line(meshplan("train", "--plan", str(path)))
    assert f"needs {2 * cap} CPU processes" in line and f"at most {cap}" in line
    assert f"{MAX_PROCS_ENV}={2 * cap}" in line


def test_the_cap_can_be_lowered_and_must_be_a_positive_integer(tmp_path):
    path = _job_file(tmp_path, dp_shard=2)
    line = _one_error_line(meshplan("train", "--plan", str(path), env_extra={MAX_PROCS_ENV: "1"}))
    assert "needs 2 CPU processes" in line and "at most 1" in line
    line = _one_error_line(meshplan("train", "--plan", str(path), env_extra={MAX_PROCS_ENV: "lots"}))
    assert f"{MAX_PROCS_ENV} must be a positive integer, got 'lots'" in line


def test_max_cpu_procs_follows_cores_and_env(monkeypatch):
    monkeypatch.delenv(MAX_PROCS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert max_cpu_procs() == 16 * PROCS_PER_CORE
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert max_cpu_procs() == MIN_PROCS_CAP
    monkeypatch.setenv(MAX_PROCS_ENV, "1024")
    assert max_cpu_procs() == 1024
    monkeypatch.setenv(MAX_PROCS_ENV, "0")
    with pytest.raises(MeshplanError, match="positive integer"):
        max_cpu_procs()


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_collective_timeout_must_be_positive_and_finite(tmp_path, value):
    path = _job_file(tmp_path, dp_shard=1)
    line = _one_error_line(meshplan("train", "--plan", str(path), "--collective-timeout-s", value))
    assert "--collective-timeout-s" in line


@pytest.mark.parametrize("procs,warns", [(3, True), (2, False)])
def test_profile_warns_when_procs_exceed_the_cores(tmp_path, monkeypatch, procs, warns):
    """In process (typer's CliRunner), with 2 cores and the profile itself replaced by a refusal
    (the CLI re-configures logging, so the command's logger is watched directly)."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import meshplan.profile.run as profile_run
    from meshplan.cli import profile_cmd
    from meshplan.cli.main import _register, app

    def refuse(*_args, **_kwargs):
        raise MeshplanError("not measured in this test")

    warnings: list[str] = []
    _register()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(profile_run, "run_profile", refuse)
    monkeypatch.setattr(profile_cmd.log, "warning", lambda msg, *args: warnings.append(msg % args))
    result = CliRunner().invoke(app, ["profile", "--procs", str(procs), "--device", "cpu",
                                      "--out", str(tmp_path / "p.json")])
    assert isinstance(result.exception, MeshplanError), result.output  # the warning comes before it
    assert bool([w for w in warnings if "more than this machine's 2 cores" in w]) == warns, warnings
