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
