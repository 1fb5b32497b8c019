"""bench/memory_rows.py: the memory terms it lists add up to the prediction on each basis, and it
flags exactly the rows more than 5% optimistic. Worked by hand."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import memory_rows as mr

from meshplan.cost.device_memory import MemoryBasis
from meshplan.spec.cluster import GIB


def _estimate():
    # 1 + 2 + 3 + 4 + 0.5 = 10.5 GiB allocated (1 of the 4 the logits, 0.5 of the 0.5 gathered),
    # + 0.25 reserve = 10.75 reserved, + 0.25 outside the allocator = 11.0 on the device
    memory = SimpleNamespace(parameters_bytes=1 * GIB, gradients_bytes=2 * GIB, optimizer_bytes=3 * GIB,
                             activations_bytes=4 * GIB, logits_bytes=1 * GIB, other_bytes=0.5 * GIB,
                             gathered_weight_bytes=0.5 * GIB, step_excess_bytes=0.0, reserve_bytes=0.25 * GIB)
    return SimpleNamespace(memory=memory, peak_memory_gib=10.75, peak_device_gib=11.0)


@pytest.mark.parametrize(("basis", "total"), [(MemoryBasis.ALLOCATED, 10.5), (MemoryBasis.RESERVED, 10.75),
                                              (MemoryBasis.DEVICE, 11.0)])
def test_terms_add_up_to_the_basis_by_hand(basis, total):
    terms = mr.terms_gib(_estimate(), basis)
    assert mr.predicted_from_terms(terms) == pytest.approx(total)
    assert terms["of_which_logits"] == pytest.approx(1.0)  # a part of activations, not added twice


def test_flagged_heldout_rows_are_the_optimistic_ones_and_sum_to_the_prediction():
    rows = mr.flagged_rows(ROOT / "bench" / "data" / "runs_heldout.csv", over_gpu=False)
    assert rows
    for r in rows:
        assert r["error"] < mr.OPTIMISTIC
        # the terms' sum is the prediction validate compared: measured x (1 + error)
        assert r["predicted_gib"] == pytest.approx(r["measured_gib"] * (1.0 + r["error"]), rel=1e-9)


def test_headroom_counts_add_up_and_the_headroom_flags_at_least_what_fits_flags():
    """Every row is an OOM row or one that ran; a plan over the GPU keeps no headroom (a
    non-negative memory error), so the headroom test flags at least the rows "fits" flags."""
    from meshplan.data.published import runs_csv

    n = mr.headroom_counts(runs_csv("calibration"))
    assert n["oom"] == 6 and n["ran"] >= 100  # the shipped set's OOM rows (notes 'OOM')
    assert n["oom_over"] <= n["oom_no_headroom"] <= n["oom"]
    assert n["ran_over"] <= n["ran_no_headroom"] <= n["ran"]


def test_rows_that_ran_over_the_gpu_are_flagged_and_oom_rows_are_not():
    from meshplan.data.published import runs_csv

    rows = mr.flagged_rows(runs_csv("calibration"), over_gpu=True)
    ids = {r["id"] for r in rows}
    assert not ids & {"193", "200", "201", "235", "236", "250"}  # OOM rows: expected over, not flagged
    assert all(r["error"] is not None and r["error"] < mr.OPTIMISTIC or not r["fits"] for r in rows)
