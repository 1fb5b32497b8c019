"""One source of truth for the attention efficiency (session 10): the kernel table
(cost/attention_kernels.py) is where a (generation, stack) starts, in a fit (calib/fit.py
``fit_start``) and in ``calibration_for`` alike; a fitted record overrides it only where the fit
moved it. Before, a pair with a record skipped the table and the fit started from the A100
default, so Megatron on Blackwell ran 0.55 where cuDNN on Blackwell is 0.44."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.calib.fit import fit_start
from meshplan.calib.priors import grid_with_start
from meshplan.cost.attention_kernels import kernel_efficiency
from meshplan.cost.calib_records import FittedRecord
from meshplan.cost.calibration import STACK_FIELDS, Calibration, calibration_for, fitted_records, stack_records
from meshplan.cost.stack_resolution import resolve_calibration
from meshplan.spec.cluster import gpu_preset


def resolved(generation: str, stack: str, record: dict | None):
    """The fields of ``stack`` on ``generation`` with ``record`` as the pair's only fitted record."""
    fitted = {} if record is None else {
        f"{generation}/{stack}": FittedRecord(key=f"{generation}/{stack}", source="fitted here", how="", values=record)}
    return resolve_calibration(generation, stack, fitted=fitted, stacks=stack_records(), lenders=(),
                               stack_fields=STACK_FIELDS, default_kernel=Calibration().attention_kernel)


def test_a_record_without_attention_efficiency_runs_the_kernel_table():
    # cuDNN on Blackwell: FA4's 71% x 0.8 / 1.3 (attention_kernels.json), not the A100 default 0.55
    out = resolved("blackwell", "megatron", {"matmul_efficiency": 0.7})
    assert out.values["attention_efficiency"] == pytest.approx(0.44)
    assert out.values["matmul_efficiency"] == 0.7
    assert "attention_efficiency 0.44 of cudnn on blackwell (attention kernel table)" in out.source
    assert out.source.startswith("fitted here")


def test_a_record_with_attention_efficiency_overrides_the_table_and_says_so():
    out = resolved("blackwell", "megatron", {"attention_efficiency": 0.6})
    assert out.values["attention_efficiency"] == 0.6
    assert "attention_efficiency 0.6 fitted (blackwell/megatron) over the table's: attention_efficiency 0.44" \
        in out.source


def test_no_record_and_a_record_that_moved_nothing_resolve_alike():
    for generation in ("ampere", "hopper", "blackwell", "blackwell-ultra"):
        for stack in stack_records():
            alone, empty = resolved(generation, stack, None), resolved(generation, stack, {})
            assert alone.values == empty.values, (generation, stack)


@pytest.mark.parametrize(("generation", "stack"), [
    ("hopper", "megatron"), ("blackwell", "megatron"), ("blackwell-ultra", "megatron"),
    ("hopper", "torchtitan"), ("ampere", "deepspeed"), ("blackwell", "meshplan")])
def test_the_fit_starts_where_an_unmoved_record_resolves(generation, stack):
    """A record keeps only what moved from ``fit_start``: a field left there must resolve to the
    same value, or the shipped estimate is not the fitted one."""
    start = fit_start(stack, {}, generation=generation)
    out = resolved(generation, stack, {})
    kernel = stack_records()[stack].values["attention_kernel"]
    entry = kernel_efficiency(generation, kernel)
    assert start.attention_efficiency == pytest.approx(out.values["attention_efficiency"])
    assert start.attention_efficiency == pytest.approx(entry.attention_efficiency)
    for field, value in entry.curve:
        assert getattr(start, field) == pytest.approx(value) == out.values[field]


def test_a_rows_own_kernel_sets_the_start():
    # a framework that runs FlashAttention-2 under the megatron stack starts from FA2's Hopper curve
    start = fit_start("megatron", {"attention_kernel": "fa2"}, generation="hopper")
    assert start.attention_efficiency == pytest.approx(kernel_efficiency("hopper", "fa2").attention_efficiency)
    assert start.attention_kernel == "fa2"


def test_a_generation_without_an_entry_starts_from_the_default():
    assert fit_start("torchtitan", {}, generation="cdna3").attention_efficiency == Calibration().attention_efficiency


def test_shipped_megatron_pairs_run_the_table_unless_fitted():
    gpus = {"hopper": "h100-sxm", "blackwell": "b200", "blackwell-ultra": "b300"}
    for generation, gpu in gpus.items():
        record = fitted_records().get(f"{generation}/megatron")
        calib = calibration_for(gpu_preset(gpu), "megatron")
        want = (record.values["attention_efficiency"] if record and "attention_efficiency" in record.values
                else kernel_efficiency(generation, "cudnn").attention_efficiency)
        assert calib.attention_efficiency == pytest.approx(want), generation
        assert "of cudnn on " in calib.source


@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=8, unique=True), st.floats(0.01, 10.0))
def test_the_grid_holds_its_start(grid, start):
    out = grid_with_start(tuple(sorted(grid)), start)
    assert start in out and set(grid) <= set(out)
    assert list(out) == sorted(out) and len(out) == len(set(out))
