"""`meshplan validate` marks rows that a twin in another release contradicts (calib/release_twins.py)
through the real entry point, and keeps them in its figures."""

from __future__ import annotations

import json

from test_validate_cli import GOOD, run, write


def test_twins_marked_in_json_and_table(tmp_path):
    """Rows 1 and 2: one job and plan (GPT 1.7B, 32 A100, mb16) in two releases of a source, one
    estimate; measured 137 and 90 TFLOP/s (1.52x apart). Row 3 repeats row 1 in row 1's release:
    no twin of it (a second measurement of one release is not a release's disagreement)."""
    rows = [{**GOOD, "source": "Megatron-Bridge 26.02"},
            {**GOOD, "id": "2", "source": "Megatron-Bridge 26.04", "measured_tflops_per_gpu": "90"},
            {**GOOD, "id": "3", "source": "Megatron-Bridge 26.02"}]
    path = str(write(tmp_path / "runs.csv", rows))
    r = run("validate", "--runs", path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert sorted((t["a"], t["b"]) for t in d["release_twins"]) == [("1", "2"), ("2", "3")]
    assert all(t["model_ratio"] == 1.0 for t in d["release_twins"])
    by_id = {x["row_id"]: x for x in d["rows"]}
    assert len(by_id["1"]["flags"]) == 1 and len(by_id["2"]["flags"]) == 2 and len(by_id["3"]["flags"]) == 1
    assert "row 2 (Megatron-Bridge 26.04)" in by_id["1"]["flags"][0]
    assert d["summary"]["flagged_rows"] == 3 and d["summary"]["throughput_rows"] == 3  # kept in the figures
    text = run("validate", "--runs", path)
    assert text.returncode == 0, text.stderr
    assert "Rows a twin in another release contradicts" in text.stdout
