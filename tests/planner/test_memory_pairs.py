"""bench/memory_pairs.py: the contrast of two rows that hold the same states, worked by hand, and
the held-out pairs it finds (torchtitan docs/performance.md@eaea6f6 Tables 5 and 6)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import memory_pairs as mp

from meshplan.calib.validate import load_runs


def _row(rid, seq, mb, measured, predicted):
    return {"id": rid, "fields": {"seq_len": seq, "micro_batch": mb, "schedule": "1f1b"},
            "tokens": seq * mb, "measured_gib": measured, "predicted_gib": predicted}


def test_contrast_by_hand():
    # a: 80 measured, 72 estimated (-10%); b: 75 measured, 73.5 estimated (-2%)
    c = mp.contrast(_row("a", 8192, 4, 80.0, 72.0), _row("b", 32768, 1, 75.0, 73.5))
    assert c["differs"] == {"seq_len": (8192, 32768), "micro_batch": (4, 1)}
    assert c["same_tokens_per_microbatch"]  # 4 x 8192 = 1 x 32768
    assert c["model_delta_gib"] == pytest.approx(1.5)
    assert c["measured_delta_gib"] == pytest.approx(-5.0)
    assert c["residual_gib"] == pytest.approx(-6.5)  # -5 - 1.5: what the estimate misses between them
    assert c["error"] == pytest.approx((-0.1, -0.02))


@pytest.fixture(scope="module")
def heldout_pairs():
    runs, _ = load_runs(ROOT / "bench" / "data" / "runs_heldout.csv")
    return {(c["a"], c["b"]): c for c in mp.pairs(runs)}


def test_heldout_405b_pairs_hold_the_same_states_and_their_measured_differences(heldout_pairs):
    # Table 5 1F1B 82.5 GiB, interleaved 72.7; Table 6 FSDP 8 CP 1 75.3, FSDP 1 CP 8 84.9
    same_tokens = heldout_pairs[("tt-13", "tt-15")]
    assert same_tokens["same_tokens_per_microbatch"]  # 4 x 8192 = 1 x 32768
    assert set(same_tokens["differs"]) == {"seq_len", "micro_batch"}
    assert same_tokens["measured_delta_gib"] == pytest.approx(75.3 - 82.5)
    assert abs(same_tokens["model_delta_gib"]) < 0.05  # the estimate holds them equal
    schedule = heldout_pairs[("tt-13", "tt-14")]
    assert set(schedule["differs"]) == {"schedule", "vpp", "stage_layers"}
    assert schedule["measured_delta_gib"] == pytest.approx(72.7 - 82.5)
    # interleaved with m = p holds one virtual stage's gradients at a time (cost/memory.py
    # accumulated_grad_params): the estimate lowers the peak, as measured
    assert schedule["model_delta_gib"] < 0
    assert heldout_pairs[("tt-15", "tt-18")]["measured_delta_gib"] == pytest.approx(84.9 - 75.3)


def test_rows_with_other_states_are_not_paired(heldout_pairs):
    # the 70B (tt-11, tt-12) never pairs with the 405B, nor the 8B rows with either
    for a, b in heldout_pairs:
        assert {a, b} <= {"tt-11", "tt-12"} or not {a, b} & {"tt-11", "tt-12"}
