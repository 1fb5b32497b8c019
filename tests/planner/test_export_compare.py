"""compare(): where a plan stands against a frontier (hand-made points, numbers by hand)."""

from dataclasses import dataclass

import pytest

from meshplan.plan import ParallelDims, Plan
from meshplan.report.compare import compare


@dataclass(frozen=True)
class Point:
    plan: Plan
    step_time_s: float
    tokens_per_s_per_gpu: float
    peak_memory_gib: float

    @property
    def fit_memory_gib(self) -> float:
        return self.peak_memory_gib


def pt(tp: int, tok: float, mem: float) -> Point:
    return Point(Plan(dims=ParallelDims(tp=tp)), 1.0 / tok, tok, mem)


FRONTIER = [pt(1, 500, 90), pt(2, 401, 64), pt(4, 330, 50), pt(8, 250, 40)]


def test_best_that_fits_and_speedup():
    c = compare(pt(1, 312, 71), FRONTIER, budget_gib=78)
    assert c.best.tokens_per_s_per_gpu == 401  # 500 needs 90 GiB > 78
    assert c.speedup == pytest.approx(401 / 312 - 1)  # +28.5%
    assert c.leanest_as_fast.peak_memory_gib == 50  # 330 >= 312 with 50 GiB
    assert c.memory_saving_gib == pytest.approx(21)
    assert c.summary() == ("yours: 312 tok/s/GPU, 71 GiB; best that fits: 401 tok/s/GPU (+29%), "
                           "64 GiB: dp1 tp2 pp1 cp1 mb1")


def test_on_the_frontier():
    c = compare(pt(2, 401, 64), FRONTIER, budget_gib=78)
    assert c.speedup == pytest.approx(0.0)
    assert "yours is on the frontier" in c.summary()


def test_yours_over_budget_and_nothing_fits():
    c = compare(pt(1, 312, 95), FRONTIER, budget_gib=78)
    assert not c.yours_fits and "over the 78 GiB budget" in c.summary()
    none = compare(pt(1, 312, 95), FRONTIER, budget_gib=30)
    assert none.best is None and none.speedup is None
    assert "no frontier plan fits 30 GiB" in none.summary()
    assert none.to_dict()["best_that_fits"] is None
