"""The one file reader and the one number check (no torch): every failure is a MeshplanError
whose message starts with the file or names the value."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanError
from meshplan.numbers import MAX_COUNT, check_count, check_finite
from meshplan.textfile import check_text_file, check_writable, csv_records, read_text_file


def test_reads_utf8_text_and_drops_a_bom(tmp_path):
    p = tmp_path / "a.json"
    p.write_bytes("\ufeff{\"x\": \"café\"}".encode("utf-8"))
    assert read_text_file(p, what="plan file") == '{"x": "café"}'


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: None, "no such plan file"),
    (lambda p: p.mkdir(), "is a directory, expected a plan file"),
    (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00"), "is a binary file, not a plan file"),
    (lambda p: p.write_bytes("caf\xe9".encode("latin-1")), "is not UTF-8 text (byte 3), expected a plan file"),
])
def test_each_failure_is_one_sentence_naming_the_file(tmp_path, make, message):
    p = tmp_path / "x.json"
    make(p)
    with pytest.raises(MeshplanError) as exc:
        read_text_file(p, what="plan file")
    assert str(exc.value) == f"{p}: {message}"


def test_missing_message_and_empty_file(tmp_path):
    with pytest.raises(MeshplanError, match="no such profile file$"):
        read_text_file(tmp_path / "p.json", what="profile", missing="no such profile file")
    (tmp_path / "e.txt").write_text(" \n")
    assert read_text_file(tmp_path / "e.txt", what="x") == " \n"
    with pytest.raises(MeshplanError, match="is empty, expected a file of arguments"):
        read_text_file(tmp_path / "e.txt", what="file of arguments", allow_empty=False)


def test_unreadable_file(tmp_path, monkeypatch):
    """Root reads any file, so the permission error is staged."""
    p = tmp_path / "locked.csv"
    p.write_text("a,b\n")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(MeshplanError, match=r"locked\.csv: permission denied \(cannot read the runs CSV\)"):
        read_text_file(p, what="runs CSV")


def test_check_text_file_sniffs_without_reading_it_all(tmp_path):
    good = tmp_path / "data.txt"
    good.write_text("hello\n" * 10)
    assert check_text_file(good, what="data file") == good
    (tmp_path / "bin").write_bytes(b"ab\x00cd")
    (tmp_path / "empty").write_text("")
    for name, msg in (("bin", "binary"), ("empty", "is empty"), ("nope", "no such data file")):
        with pytest.raises(MeshplanError, match=msg):
            check_text_file(tmp_path / name, what="data file")
    with pytest.raises(MeshplanError, match="is a directory"):
        check_text_file(tmp_path, what="data file")


def test_check_writable_leaves_no_file_behind(tmp_path):
    out = tmp_path / "plan.json"
    assert check_writable(out, what="plan") == out and not out.exists()
    out.write_text("kept")
    check_writable(out, what="plan")
    assert out.read_text() == "kept"
    for bad, msg in ((tmp_path, "is a directory"), (tmp_path / "no" / "x.json", "does not exist"),
                     (out / "x.json", "is not a folder")):
        with pytest.raises(MeshplanError, match=msg):
            check_writable(bad, what="plan")


def test_csv_records_checks_the_header_once_for_every_reader():
    rows = list(csv_records("a,b,c\n1,2,3\n", "r.csv", required=("a", "c"), what="runs CSV"))
    assert rows == [{"a": "1", "b": "2", "c": "3"}]
    with pytest.raises(MeshplanError, match=r"^r.csv: not a runs CSV, missing column\(s\): c, d$"):
        list(csv_records("a,b\n1,2\n", "r.csv", required=("a", "c", "d"), what="runs CSV"))
    with pytest.raises(MeshplanError, match=r"^x.csv: cannot read CSV: "):
        list(csv_records("a,b\n" + "1" * (csv.field_size_limit() + 1) + ",2\n", "x.csv", required=("a",),
                         what="recipes CSV"))


def test_csv_records_is_lazy_so_an_early_bad_row_is_named_first():
    """A caller's check of row 1 fires before the CSV syntax error of a later row (what
    parse_recipes reported when it walked the reader itself)."""
    records = csv_records("a\n1\n" + "2" * (csv.field_size_limit() + 1) + "\n", "r.csv", required=("a",),
                          what="runs CSV")
    assert next(records) == {"a": "1"}
    with pytest.raises(MeshplanError, match=r"^r.csv: cannot read CSV: field larger"):
        next(records)


@given(st.integers(min_value=1, max_value=MAX_COUNT))
def test_counts_in_range_pass_unchanged(n):
    assert check_count("n", n) == n


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_COUNT + 1), st.floats(), st.booleans(),
                 st.text(max_size=3), st.none()))
def test_everything_else_is_refused_with_its_name(v):
    with pytest.raises(MeshplanError, match=r"^seq_len"):
        check_count("seq_len", v)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_finite_check(x):
    if math.isfinite(x) and x > 0:
        assert check_finite("w", x, positive=True) == x
    else:
        with pytest.raises(MeshplanError, match=r"^w must be"):
            check_finite("w", x, positive=True)
    if math.isfinite(x) and x >= 0:
        assert check_finite("w", x) == x


def test_specs_use_the_checks():
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.training import TrainingSpec

    with pytest.raises(MeshplanError, match="seq_len = 99999999999999999999 is too large"):
        TrainingSpec(seq_len=99999999999999999999, global_batch=8)
    with pytest.raises(MeshplanError, match="inter_node_bandwidth_bytes_per_s must be a finite number"):
        from dataclasses import replace

        replace(system_preset("dgx-h100"), inter_node_bandwidth_bytes_per_s=float("nan"))
    with pytest.raises(MeshplanError, match="GPU count = 4294967296 is too large"):
        system_preset("dgx-h100").with_gpus(2**32)
