"""Output that survives a pipe (issue 12, items 8 and 10): tables in full width and never cut when
stdout is not a terminal, `--json` on every command, and `meshplan clusters --example`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["models", "clusters", "estimate", "plan", "explain", "validate", "profile", "train", "report",
            "replan", "export", "import"]
ELLIPSIS = "\u2026"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "60"}  # a narrow terminal, were it one
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def test_models_row_greps_whole():
    r = run("models")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "llama3-70b " in line)
    for value in ("70.55B", "80", "8192", "28672", "128256"):
        assert value in row
    assert ELLIPSIS not in r.stdout


def test_explain_prints_whole_numbers(tmp_path):
    job = tmp_path / "job.json"
    p = run("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "2", "--seq-len", "4096",
            "--global-batch", "256", "--out", str(job))
    assert p.returncode == 0, p.stderr
    assert ELLIPSIS not in p.stdout
    e = run("explain", str(job))
    assert e.returncode == 0, e.stderr
    assert ELLIPSIS not in e.stdout
    assert max(len(line) for line in e.stdout.splitlines()) > 60  # not folded to the 60 columns
    assert "Per pipeline rank" in e.stdout
    assert "calibration:" in e.stdout
    # which source the attention efficiency came from: the kernel table (FA2 on H100, meshplan's stack)
    j = run("explain", str(job), "--json")
    assert j.returncode == 0, j.stderr
    out = json.loads(j.stdout)
    assert "of fa2 on hopper (attention kernel table)" in out["calibration_source"]
    assert out["attention_efficiency"] == pytest.approx(0.42)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_json(command):
    r = run(command, "--help")
    assert r.returncode == 0 and "--json" in r.stdout


def test_cluster_example_round_trip(tmp_path):
    r = run("clusters", "--example")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert data["gpus_per_node"] == 8 and "#" in r.stdout
    (tmp_path / "mine.yaml").write_text(r.stdout)
    e = run("estimate", "--model", "llama3-8b", "--cluster", "mine.yaml", "--tp", "8", "--seq-len", "4096",
            "--global-batch", "512", "--json", cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["cluster"] == {"name": "my-h100-cluster", "gpu": "my-h100", "num_gpus": 128}
    j = run("clusters", "--example", "--json")
    assert json.loads(j.stdout)["cluster"]["inter_node_bandwidth_bytes_per_s"] == 25e9


def test_cluster_file_error_is_one_line(tmp_path):
    (tmp_path / "c.yaml").write_text("system: dgx-h100\ninter_node_bandwith_bytes_per_s: 25e9\n")
    e = run("estimate", "--model", "llama3-8b", "--cluster", "c.yaml", "--seq-len", "4096", "--global-batch", "512",
            cwd=tmp_path)
    assert e.returncode == 2
    assert e.stderr.strip().splitlines() == [
        "error: c.yaml: unknown cluster field(s): inter_node_bandwith_bytes_per_s "
        "(see `meshplan clusters --example` or docs/clusters.md)"]


def test_narrow_terminal_folds_a_cell_instead_of_cutting_it():
    import io

    from rich.table import Table

    from meshplan.cli.common import UncutConsole

    t = Table(title="t")
    t.add_column("plan")
    t.add_column("s", justify="right")
    t.add_row("dp32 zero2x2 tp2sp pp8(interleaved-1f1b,v8) cp2 mb1 layers=2x8,1,2x6,1x6,2x2,1x41", "7.716")
    buf = io.StringIO()
    UncutConsole(file=buf, width=40, force_terminal=True, color_system=None).print(t)
    text = buf.getvalue()
    assert ELLIPSIS not in text and "7.716" in text
    assert "1x41" in text.replace("\u2502", "").replace(" ", "").replace("\n", "")
