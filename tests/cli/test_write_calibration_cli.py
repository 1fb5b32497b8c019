"""`meshplan validate --fit --write-calibration --out PATH [--force]`: a refit is written where the
user says, and no existing file (the shipped calibration least of all) is replaced without --force.
Through the real entry point; the fit runs on the four V100 rows of the shipped runs (seconds)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.calib.records import fitted_file
from meshplan.data.published import runs_csv

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", "validate", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=cwd)


@pytest.fixture()
def v100_runs(tmp_path) -> Path:
    with runs_csv("calibration").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    path = tmp_path / "v100.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r for r in rows if r["gpu"].startswith("v100"))
    return path


def test_a_new_out_is_the_shipped_file_with_the_refit_records(tmp_path, v100_runs):
    shipped_before = fitted_file().read_bytes()
    out = tmp_path / "refit.json"
    r = run("--runs", str(v100_runs), "--fit", "--write-calibration", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert fitted_file().read_bytes() == shipped_before  # the shipped file untouched
    new, shipped = json.loads(out.read_text()), json.loads(shipped_before)
    assert {k for k in new["records"] if new["records"][k] != shipped["records"].get(k)} == {"volta/megatron"}
    assert "v100.csv" in new["records"]["volta/megatron"]["source"]
    assert {k: v for k, v in new.items() if k != "records"} == {k: v for k, v in shipped.items() if k != "records"}


def test_an_existing_out_is_replaced_only_with_force(tmp_path, v100_runs):
    out = tmp_path / "mine.json"
    out.write_bytes(fitted_file().read_bytes())
    data = json.loads(out.read_text())
    data["records"]["hopper/megatron"]["source"] = "my own fit"  # a record the refit does not touch
    out.write_text(json.dumps(data))
    before = out.read_text()
    args = ("--runs", str(v100_runs), "--fit", "--write-calibration", "--out", str(out))
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2 and "exists: give --force" in r.stderr and "Traceback" not in r.stderr
    assert out.read_text() == before
    r = run(*args, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    after = json.loads(out.read_text())
    assert after["records"]["hopper/megatron"]["source"] == "my own fit"
    assert after["records"]["volta/megatron"] != data["records"]["volta/megatron"]


@pytest.mark.parametrize("extra, message", [
    ((), "--write-calibration needs --out PATH"),
    (("--out", "{shipped}"), "(the shipped calibration) exists: give --force"),
    (("--out", "{tmp}/bad.json", "--force"), "bad.json: not a calibration data file"),
    (("--out", "{tmp}/no/such/dir/x.json"), "does not exist"),
])
def test_refused_before_the_fit_in_one_line(tmp_path, v100_runs, extra, message):
    (tmp_path / "bad.json").write_text("{}")
    shipped_before = fitted_file().read_bytes()
    extra = tuple(a.format(shipped=fitted_file(), tmp=tmp_path) for a in extra)
    r = run("--runs", str(v100_runs), "--fit", "--write-calibration", *extra, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert fitted_file().read_bytes() == shipped_before


@pytest.mark.parametrize("flags", [("--out", "x.json"), ("--force",), ("--fit", "--out", "x.json")])
def test_out_and_force_belong_to_write_calibration(tmp_path, v100_runs, flags):
    r = run("--runs", str(v100_runs), *flags, cwd=tmp_path)
    assert r.returncode == 2 and "goes with --fit --write-calibration" in r.stderr
    assert not (tmp_path / "x.json").exists()
