"""Fuzz validate --runs: one published row with a cell replaced; exit 0 or 2, one ``error:`` line,
never a traceback (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import FUZZ, ODD_TEXT, assert_clean, run_cli, runs_csv_text, write
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)


@FUZZ
@given(which=st.integers(min_value=0, max_value=1), pick=st.integers(min_value=0), cell=ODD_TEXT,
       extra=st.sampled_from([[], ["--holdout"], ["--target", "megatron"]]))
def test_fuzz_runs_csv_cells(which, pick, cell, extra, runs_rows, tmp_path_factory):
    header, row = runs_rows[which]
    row = {**row, header[pick % len(header)]: cell}
    path = write(tmp_path_factory.mktemp("runs"), "runs.csv", runs_csv_text(header, row))
    assert_clean(["validate", "--runs", str(path), "--json"] + extra)


@pytest.mark.parametrize("memory", ["0", "-3"])
def test_regression_runs_csv_memory(memory, runs_rows, tmp_path):
    """A measured peak memory of 0 divided by zero in the memory error (ZeroDivisionError)."""
    header, row = runs_rows[0]
    path = write(tmp_path, "runs.csv", runs_csv_text(header, {**row, "measured_peak_mem_gib": memory}))
    code, err = assert_clean(["validate", "--runs", str(path), "--json"])
    assert code == 2 and "measured_peak_mem_gib" in err and "> 0 GiB" in err, err


def test_regression_validate_fit_json(runs_rows, tmp_path):
    """`validate --fit --json` raised TypeError: a fit's settings (a MappingProxyType) were not JSON."""
    header, row = runs_rows[0]
    argv = ["validate", "--runs", str(write(tmp_path, "runs.csv", runs_csv_text(header, row))), "--fit", "--json"]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert json.loads(out)["fit"], out


def test_regression_runs_csv_blank_source(runs_rows, tmp_path):
    """A blank source cell raised IndexError in the pairwise table's release (calib/pairwise.py)."""
    header, row = runs_rows[0]
    path = write(tmp_path, "runs.csv", runs_csv_text(header, {**row, "source": ""}))
    code, _ = assert_clean(["validate", "--runs", str(path), "--json"])
    assert code == 0
