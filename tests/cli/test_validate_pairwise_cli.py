"""`meshplan validate` reports the error of the model's ratio between two measured layouts of one
job (calib/pairwise.py), in the table and in --json, through the real entry point."""

from __future__ import annotations

import json
import math

import pytest

from test_validate_cli import GOOD, run, write


def test_pairwise_ratio_error_of_a_hand_made_job(tmp_path):
    """Rows 1 and 2: one job (GPT 1.7B, 32 A100, batch 512) at mb16 and mb8, same source; row 3
    another GPU count (not paired). The pair's error is |log(model ratio / measured ratio)|, taken
    back from the two rows' own validate errors."""
    rows = [GOOD, {**GOOD, "id": "2", "micro_batch_size": "8", "measured_tflops_per_gpu": "120"},
            {**GOOD, "id": "3", "num_gpus": "64"}]
    r = run("validate", "--runs", str(write(tmp_path / "runs.csv", rows)), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    pw = d["pairwise"]
    assert pw["all"]["pairs"] == 1 and len(pw["pairs"]) == 1
    pair = pw["pairs"][0]
    assert (pair["a"], pair["b"], pair["knobs"]) == ("1", "2", ["mb"])
    by_id = {x["row_id"]: x for x in d["rows"]}
    one, two = by_id["1"], by_id["2"]
    # same FLOPs per step: the measured step ratio is the inverse TFLOP/s ratio
    assert pair["measured_ratio"] == pytest.approx(120 / 137)
    assert pair["model_ratio"] == pytest.approx(one["predicted_step_s"] / two["predicted_step_s"])
    assert pair["error"] == pytest.approx(abs(math.log(1 + one["error"]) - math.log(1 + two["error"])))
    assert pw["by_knob"]["mb"]["pairs"] == 1 and pw["by_knob_alone"]["mb"]["pairs"] == 1


def test_pairwise_table_on_the_shipped_bridge_set():
    r = run("validate", "--runs", "megatron-bridge")
    assert r.returncode == 0, r.stderr
    assert "Ratio between two measured layouts of one job" in r.stdout and "misordered" in r.stdout
