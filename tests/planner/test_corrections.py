"""The documented corrections (data/corrections.csv): the shipped CSVs are the shared copies with
them applied, and a correction touches only the row it was written for."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from meshplan.calib.corrections import (
    CORRECTED_NOTE,
    IDENTIFYING_COLUMNS,
    apply_corrections,
    shipped_corrections,
)
from meshplan.calib.validate import REQUIRED_COLUMNS, load_corrected_runs, read_rows
from meshplan.data.published import PUBLISHED_RUNS, runs_csv

REPO = Path(__file__).resolve().parents[2]
SHARED_CANDIDATES = (REPO.parent / "shared" / "data", Path("/work/shared/data"))
OPTIONAL_COLUMNS = ("framework", "system", "memory_basis")


def shared_data() -> Path:
    for d in SHARED_CANDIDATES:
        if all((d / f).is_file() for f in PUBLISHED_RUNS.values()):
            return d
    pytest.skip(f"the shared data (runs CSVs) is in none of {', '.join(map(str, SHARED_CANDIDATES))}: "
                "the installed package carries the corrected copies only")


def rows_by_id(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {r["id"]: r for r in rows}


def published_rows(set_name: str) -> list[dict[str, str]]:
    """The shipped rows with every correction undone (cells only; the notes keep their line)."""
    rows = [dict(r) for r in read_rows(runs_csv(set_name))]
    by_id = rows_by_id(rows)
    for c in shipped_corrections():
        if c.set_name == set_name:
            by_id[c.row_id][c.column] = c.published
    return rows


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_every_correction_is_well_formed_and_names_a_shipped_row_it_corrected():
    corrections = shipped_corrections()
    assert corrections
    keys = [(c.set_name, c.row_id, c.column) for c in corrections]
    assert len(keys) == len(set(keys)), "one correction per cell"
    shipped = {name: rows_by_id(read_rows(runs_csv(name))) for name in PUBLISHED_RUNS}
    for c in corrections:
        assert c.set_name in PUBLISHED_RUNS
        assert c.column in REQUIRED_COLUMNS + OPTIONAL_COLUMNS and c.column not in IDENTIFYING_COLUMNS + ("id",)
        assert c.published != c.corrected and c.evidence
        row = shipped[c.set_name][c.row_id]
        assert c.matches(row), f"row {c.row_id}: identifying columns differ from the shipped row"
        assert row[c.column].strip() == c.corrected
        assert CORRECTED_NOTE in row["notes"] and c.change() in row["notes"]


@pytest.mark.parametrize("set_name", list(PUBLISHED_RUNS))
def test_shipped_copy_is_the_shared_copy_with_the_corrections(set_name):
    shared = read_rows(shared_data() / PUBLISHED_RUNS[set_name])
    corrected, report = apply_corrections(shared, shipped_corrections())
    mine = [c for c in shipped_corrections() if c.set_name == set_name]
    assert len(report.applied) == len(mine) and not report.not_applied
    shipped = read_rows(runs_csv(set_name))
    columns = set(shipped[0])
    assert set(shared[0]) <= columns
    assert [r["id"] for r in corrected] == [r["id"] for r in shipped]
    for got, want in zip(corrected, shipped):
        assert {k: got.get(k, "") for k in columns} == want, f"row {want['id']}"


@pytest.mark.parametrize("set_name", list(PUBLISHED_RUNS))
def test_shipped_copy_takes_no_correction_twice(set_name):
    rows = read_rows(runs_csv(set_name))
    corrected, report = apply_corrections(rows, shipped_corrections())
    assert corrected == rows and not report.applied and not report.not_applied


def test_corrections_undone_and_reapplied_give_the_shipped_rows(tmp_path):
    published = published_rows("megatron-bridge")
    path = write_csv(tmp_path / "bridge.csv", published)
    runs, _, report = load_corrected_runs(path)
    assert {c.row_id for c in report.applied} == {"538", "543", "555", "556", "557", "442", "448"}
    got = {r.row_id: r for r in runs}
    assert got["538"].plan.micro_batch == 1 and got["555"].training.precision.value == "fp8"
    # the 26.02.01 layouts of the presets every other release prints (corrections.csv's evidence)
    assert (got["442"].plan.micro_batch, got["442"].plan.vpp) == (1, 5)
    assert got["448"].plan.vpp == 8
    raw, _, none = load_corrected_runs(path, as_published=True)
    assert not none.applied and none.as_published
    raw_by_id = {r.row_id: r for r in raw}
    assert raw_by_id["538"].plan.micro_batch == 4
    assert (raw_by_id["442"].plan.micro_batch, raw_by_id["442"].plan.vpp, raw_by_id["448"].plan.vpp) == (2, 1, 4)


def test_a_row_whose_identifying_columns_differ_is_not_corrected(tmp_path):
    published = published_rows("megatron-bridge")
    tampered = rows_by_id(published)["538"]
    tampered["num_gpus"] = "128"  # another run under the same id
    tampered["dp"] = "32"
    path = write_csv(tmp_path / "bridge.csv", published)
    runs, _, report = load_corrected_runs(path)
    assert "538" not in {c.row_id for c in report.applied} and not report.not_applied
    assert {r.row_id: r for r in runs}["538"].plan.micro_batch == 4
    assert "543" in {c.row_id for c in report.applied}


def test_a_cell_that_is_neither_published_nor_corrected_is_reported_not_applied():
    c = next(c for c in shipped_corrections() if c.row_id == "538")
    row = {"id": c.row_id, **dict(c.identity), c.column: "8", "notes": ""}
    out, report = apply_corrections([row], shipped_corrections())
    assert out == [row] and not report.applied
    assert [x.row_id for x, _ in report.not_applied] == ["538"] and "'8'" in report.not_applied[0][1]


def test_an_unrelated_file_with_the_same_ids_is_left_alone():
    text = "id,source,model,gpu,num_gpus,framework,notes\n12,my run,llama,h100-sxm,8,megatron-lm,\n"
    rows = list(csv.DictReader(io.StringIO(text)))
    out, report = apply_corrections(rows, shipped_corrections())
    assert out == rows and not report.applied and not report.not_applied
