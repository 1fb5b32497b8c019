"""bench/cp_ring_whatif.py: stretching the ring's later steps moves only the CP rows, and at 1 it
is the shipped estimate."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import cp_ring_whatif as wi

from meshplan.calib.validate import evaluate, load_runs


def test_factor_one_is_the_shipped_estimate():
    runs = [r for r in load_runs(ROOT / "bench" / "data" / "runs_heldout.csv")[0] if r.row_id in wi.ROWS]
    shipped = {r.row_id: r.error for r in evaluate(runs, []).rows}
    assert wi.errors(1.0) == pytest.approx(shipped)


def test_stretch_slows_every_cp_row_and_leaves_cp1_alone():
    base, slow = wi.errors(1.0), wi.errors(1.5)
    for rid in ("tt-4", "tt-15"):  # cp1: no ring
        assert slow[rid] == pytest.approx(base[rid])
    for rid in ("tt-5", "tt-6", "tt-7", "tt-16", "tt-17", "tt-18"):
        assert slow[rid] < base[rid] - 0.01  # + = predicted too fast: a slower ring lowers it


def test_stretch_divides_only_the_non_causal_efficiency():
    seen = {}

    def fake(**kwargs):
        seen["eff"] = kwargs["efficiency"]
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wi, "torch_cp_cost", fake)
        wi.stretched(2.0)(efficiency=lambda kv, causal, bwd: 0.6)
    assert seen["eff"](1024, True, False) == pytest.approx(0.6)
    assert seen["eff"](1024, False, True) == pytest.approx(0.3)


def test_eager_waits_only_where_asked():
    seen = []

    def fake(**kwargs):
        seen.append(kwargs.get("eager", "stack"))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wi, "torch_cp_cost", fake)
        wi.stretched(1.0)(efficiency=lambda kv, causal, bwd: 0.5, eager=False)
        wi.stretched(1.0, eager=True)(efficiency=lambda kv, causal, bwd: 0.5, eager=False)
    assert seen == [False, True]


def test_eager_hides_the_405b_ring_collectives():
    # the 405B CP group spans nodes: waited at first use its gathers hide behind step 0 and the
    # sends behind the next step, so the estimate is faster (the error rises); cp1 has no ring
    traced, eager = wi.errors(1.0), wi.errors(1.0, eager=True)
    assert eager["tt-15"] == pytest.approx(traced["tt-15"])
    assert eager["tt-18"] > traced["tt-18"] + 0.05
