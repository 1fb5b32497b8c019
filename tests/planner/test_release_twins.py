"""Rows a twin in another release contradicts (calib/release_twins.py): checked by hand on made-up
rows, as a property over the two ratios, and on the shipped Megatron-Bridge rows."""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.release_twins import (
    FLAG_PREFIX, MODEL_SAME_RUN, TWIN_UNEXPLAINED, disagreements, mark_rows, twin_key,
)
from meshplan.calib.validate import RowResult, ValidationReport
from meshplan.plan import ParallelDims, Plan

BASE = Plan(dims=ParallelDims(dp_shard=8), zero=1)
MB4 = Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=4)


def _run(row_id: str, source: str, plan: Plan = BASE, precision: str = "fp8"):
    return SimpleNamespace(
        row_id=row_id, plan=plan, source=source, stack="megatron",
        model=SimpleNamespace(name="m", is_moe=True), cluster=SimpleNamespace(gpu=SimpleNamespace(name="h100"), num_gpus=8),
        training=SimpleNamespace(seq_len=4096, global_batch=64, precision=SimpleNamespace(value=precision)))


def _row(row_id: str, error: float, predicted_step_s: float) -> RowResult:
    """A tokens/s row: the measured step is predicted_step_s * (1 + error)."""
    return RowResult(row_id=row_id, source="", model="m", plan="", gpu="h100", metric="tokens_per_s_per_gpu",
                     measured=1.0, predicted=1.0 + error, error=error, measured_memory_gib=None,
                     predicted_memory_gib=0.0, memory_error=None, fits=True, oom=False,
                     predicted_step_s=predicted_step_s)


def _report(rows) -> ValidationReport:
    return ValidationReport(rows=tuple(rows), skipped=())


def test_twins_by_hand():
    """Model: a 1.00 s, b 1.02 s (the same run to 2%). Measured: a's throughput over-predicted by
    50% (step 1.5 s), b's exact (1.02 s): measured a/b 1.5/1.02 = 1.47, model 0.98, a gap of 50%
    the model cannot close for both. c ran another plan, d the same release as a, e's model
    separates it from a by 25% (a release setting the model knows): none of them is a twin."""
    runs = [_run("a", "Megatron-Bridge 26.02"), _run("b", "Megatron-Bridge 26.02.01", precision="bf16"),
            _run("c", "Megatron-Bridge 26.04", plan=MB4), _run("d", "Megatron-Bridge 26.02"),
            _run("e", "Megatron-Bridge 26.06")]
    rows = [_row("a", 0.50, 1.0), _row("b", 0.0, 1.02), _row("c", 0.0, 1.0), _row("d", 0.48, 1.0),
            _row("e", 0.0, 0.8)]
    found = disagreements(runs, _report(rows))
    # a-b and d-b: both 26.02 rows against 26.02.01 (any precision: the 25.09 tables print none)
    assert {(f.a, f.b) for f in found} == {("a", "b"), ("b", "d")}
    ab = next(f for f in found if f.a == "a")
    assert ab.measured_ratio == pytest.approx(1.5 / 1.02) and ab.model_ratio == pytest.approx(1.0 / 1.02)
    assert ab.release_b == "Megatron-Bridge 26.02.01"
    marked = mark_rows(_report(rows), found)
    by_id = {r.row_id: r for r in marked.rows}
    assert by_id["a"].flags == (f"{FLAG_PREFIX}: measured step 1.47x that of row b (Megatron-Bridge 26.02.01), the model "
                                "0.98x: a release regression or a misread table line suspected",)
    assert len(by_id["b"].flags) == 2 and "0.68x that of row a" in by_id["b"].flags[0]
    assert by_id["c"].flags == () and by_id["e"].flags == ()
    # marks only: errors and figures unchanged
    assert [r.error for r in marked.rows] == [r.error for r in rows]
    assert marked.throughput_p90_abs_error == _report(rows).throughput_p90_abs_error
    assert marked.summary()["flagged_rows"] == 3 and _report(rows).summary()["flagged_rows"] == 0


def test_twin_key_is_job_and_plan():
    a, b = _run("a", "Megatron-Bridge 26.02"), _run("b", "Megatron-Bridge 25.09", precision="bf16")
    assert twin_key(a) == twin_key(b) != twin_key(_run("c", "Megatron-Bridge 26.02", plan=MB4))


@settings(max_examples=200, deadline=None)
@given(model_ratio=st.floats(0.5, 2.0), measured_ratio=st.floats(0.4, 2.5))
def test_mark_iff_model_alike_and_gap_unexplained(model_ratio, measured_ratio):
    """A pair is marked exactly when the model sees one run (within MODEL_SAME_RUN) and the measured
    ratio is more than TWIN_UNEXPLAINED from the model's (both on a log scale)."""
    runs = [_run("a", "Megatron-Bridge 26.02"), _run("b", "Megatron-Bridge 26.04")]
    # b: model 1 s, measured 1 s; a: model model_ratio s, measured measured_ratio s
    rows = [_row("a", measured_ratio / model_ratio - 1.0, model_ratio), _row("b", 0.0, 1.0)]
    found = disagreements(runs, _report(rows))
    lp, lm = math.log(model_ratio), math.log(measured_ratio)
    margin = 1e-9  # ratios rebuilt through the error: float rounding at the boundary
    if abs(abs(lp) - math.log1p(MODEL_SAME_RUN)) < margin or abs(abs(lm - lp) - math.log1p(TWIN_UNEXPLAINED)) < margin:
        return
    expect = abs(lp) < math.log1p(MODEL_SAME_RUN) and abs(lm - lp) > math.log1p(TWIN_UNEXPLAINED)
    assert bool(found) == expect
    marked = mark_rows(_report(rows), found)
    assert all(bool(r.flags) == expect for r in marked.rows)


def test_shipped_bridge_twins():
    """Rows 503 (26.02) and 466 (26.02.01), Qwen3-30B-A3B on 16 H100 in one plan: measured 1.77x
    apart, one estimate. Every mark the shipped rows get keeps both of its rows in the figures."""
    from meshplan.calib.validate import evaluate, load_corrected_runs
    from meshplan.data.published import runs_csv

    runs, skipped, _ = load_corrected_runs(runs_csv("megatron-bridge"))
    report = evaluate(runs, skipped)
    found = disagreements(runs, report)
    assert ("466", "503") in {(f.a, f.b) for f in found}
    assert all(abs(math.log(f.model_ratio)) < math.log1p(MODEL_SAME_RUN) for f in found)
    marked = mark_rows(report, found)
    assert len(marked.rows) == len(report.rows)
    assert marked.throughput_p90_abs_error == report.throughput_p90_abs_error
