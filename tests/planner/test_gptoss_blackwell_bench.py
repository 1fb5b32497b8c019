"""bench/bench_gptoss_blackwell.py's tables (the bf16 bias of GPT-OSS on Blackwell): the time the
model lacks, a rate's closing factor, the Blackwell-over-H100 ratios and the source's FLOPs per
token, checked by hand on row 367 (Megatron-Bridge 26.04.01, GB300, GPT-OSS 120B bf16: GBS 1280,
MBS 4, 4096 tokens, 64 GPUs, 19200 tokens/s and 523 TFLOP/s per GPU) and row 371 (the same
release's H100 row: 5824 tokens/s)."""

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_gptoss_blackwell as bg

from meshplan.calib.validate import load_corrected_runs
from meshplan.data.published import runs_csv


@pytest.fixture(scope="module")
def runs():
    return {r.row_id: r for r in load_corrected_runs(runs_csv("megatron-bridge"))[0]}


def test_missing_time_is_measured_step_minus_predicted(runs):
    row = bg.row_table(runs["367"])
    # 1280 sequences x 4096 tokens over 64 GPUs = 81920 tokens a GPU per step, at 19200 tokens/s
    assert row["measured_step_s"] == pytest.approx(81920 / 19200)
    assert row["missing_s"] == pytest.approx(81920 / 19200 - row["predicted_step_s"])
    # 1280 / (4 x 64) = 5 micro-batches of 36 layers (pp 1)
    assert row["missing_ms_per_layer_microbatch"] == pytest.approx(1e3 * row["missing_s"] / (5 * 36))


def test_closing_factor_makes_the_row_match(runs):
    run = runs["367"]
    calib = bg._calib(run)
    target = 81920 / 19200
    f = bg.closing_factor(run, calib, "attention_efficiency", target)
    assert 0.0 < f < 1.0  # the row is predicted faster than measured
    slowed = calib.replace_fields(attention_efficiency=calib.attention_efficiency * f)
    assert bg._step_s(run, slowed) == pytest.approx(target, rel=1e-3)


def test_closing_factor_is_one_when_the_row_is_predicted_slower(runs):
    run = runs["367"]
    calib = bg._calib(run)
    assert bg.closing_factor(run, calib, "matmul_efficiency", 0.5 * bg._step_s(run, calib)) == 1.0


def test_blackwell_over_h100_of_the_same_release(runs):
    picked = [runs["367"], runs["371"]]
    preds = {"367": 2.0, "371": 1.0}  # predicted tokens/s: a ratio of 2
    (s,) = bg.scaling_table(picked, preds)
    assert (s["gpu"], s["precision"]) == ("gb300", "bf16")
    assert s["measured_ratio"] == pytest.approx(19200 / 5824)
    assert s["predicted_over_measured"] == pytest.approx(2.0 / (19200 / 5824))


def test_source_flops_per_token(runs):
    with open(runs_csv("megatron-bridge"), newline="") as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh)}
    got = {f["row_id"]: f for f in bg.source_flops_table([runs["367"]], rows, "gpt-oss-120b")}
    assert got["367"]["source_gflop_per_token"] == pytest.approx(523e3 / 19200)  # 27.2 G
