"""`meshplan validate --runs FILE` applies the documented corrections (data/corrections.csv) that
match FILE's rows, says so, and `--as-published` validates the file as given: through the real
entry point, on a copy of the shared calibration runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.calib.corrections import shipped_corrections

REPO = Path(__file__).resolve().parents[2]
SHARED_CANDIDATES = (REPO.parent / "shared" / "data", Path("/work/shared/data"))


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.fixture(scope="module")
def shared_copy(tmp_path_factory) -> Path:
    for d in SHARED_CANDIDATES:
        if (d / "runs_calibration.csv").is_file():
            dst = tmp_path_factory.mktemp("runs") / "runs_calibration.csv"
            shutil.copyfile(d / "runs_calibration.csv", dst)
            return dst
    pytest.skip(f"the shared data is in none of {', '.join(map(str, SHARED_CANDIDATES))}")


def as_json(*args: str) -> dict:
    r = run("validate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_validate_says_which_corrections_it_applied_and_lists_them_under_verbose(shared_copy):
    n = sum(c.set_name == "calibration" for c in shipped_corrections())
    r = run("--verbose", "validate", "--runs", str(shared_copy))
    assert r.returncode == 0, r.stderr
    assert (f"applied {n} documented corrections from meshplan/data/corrections.csv" in r.stdout
            and "--as-published to validate the file as given" in r.stdout)
    assert "corrected row 12: framework megatron-lm -> deepspeed-2021" in " ".join(r.stderr.split())  # rich wraps


def test_corrected_shared_copy_gives_the_shipped_figures_and_as_published_the_raw_ones(shared_copy):
    shipped = as_json("--runs", "calibration")
    corrected = as_json("--runs", str(shared_copy))
    raw = as_json("--runs", str(shared_copy), "--as-published")
    assert shipped["corrections"]["applied"] == [] and raw["corrections"]["applied"] == []
    assert raw["corrections"]["as_published"] is True
    applied = corrected["corrections"]["applied"]
    assert len(applied) == sum(c.set_name == "calibration" for c in shipped_corrections())
    assert {"set": "calibration", "id": "52", "column": "recompute", "published": "", "corrected": "full"} \
        .items() <= next(a for a in applied if a["id"] == "52" and a["column"] == "recompute").items()
    assert corrected["summary"] == shipped["summary"]
    assert corrected["rows"] == shipped["rows"]
    # as published: rows 251-256 are compared on their printed TFLOP/s, 52-63 without recompute
    by_id = {x["row_id"]: x for x in raw["rows"]}
    assert by_id["251"]["metric"] == "tflops_per_gpu"
    assert {x["row_id"]: x for x in corrected["rows"]}["251"]["metric"] == "step_time_s"
    assert raw["summary"]["throughput_median_abs_error"] != corrected["summary"]["throughput_median_abs_error"]
    assert raw["summary"]["memory_median_abs_error"] > corrected["summary"]["memory_median_abs_error"]
