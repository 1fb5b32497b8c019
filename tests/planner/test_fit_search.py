"""The fit's optimizer (calib/fit_search.py): coordinate descent with perturbed restarts, and the
sweep that re-estimates only the row groups a field moves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.fit_search import Objective, descend
from meshplan.cost.calibration import Calibration

GRID = {"matmul_efficiency": (0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
        "attention_efficiency": (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)}


def _objective(target: dict[str, float], calls: list | None = None) -> Objective:
    """Three groups: the first sees only the GEMM efficiency, the second only the attention
    efficiency, the third their product (a coupled direction); values are 'times' 1/eff."""

    def predict(g: int, c: Calibration) -> np.ndarray:
        if calls is not None:
            calls.append(g)
        m, a = c.matmul_efficiency, c.attention_efficiency
        return np.array([1 / m, 1 / a, 1 / (m * a)][g:g + 1])

    meas = np.array([1 / target["matmul_efficiency"], 1 / target["attention_efficiency"],
                     1 / (target["matmul_efficiency"] * target["attention_efficiency"])])
    return Objective(rows=((0,), (1,), (2,)), predict=predict,
                     score=lambda p: float(np.mean(np.abs(np.log(p / meas)))), size=3)


def test_descent_recovers_the_truth_and_skips_groups_a_field_leaves():
    calls: list[int] = []
    obj = _objective({"matmul_efficiency": 0.6, "attention_efficiency": 0.8}, calls)
    fit = descend(obj, Calibration(matmul_efficiency=0.7, attention_efficiency=0.5), GRID, rounds=5)
    assert (fit.matmul_efficiency, fit.attention_efficiency) == pytest.approx((0.6, 0.8))
    # a matmul sweep re-estimates groups 0 and 2 at the inner grid values, never group 1
    # (it is estimated only at the grid's two ends, to see that it does not move)
    assert calls.count(1) < calls.count(0)


def _valley(c: Calibration) -> float:
    """A loss whose minimum (0.8, 0.8) lies along a diagonal ridge: from (0.5, 0.5) no single
    field improves, only moving both does."""
    m, a = c.matmul_efficiency, c.attention_efficiency
    if abs(m - a) > 1e-9:
        return 1.0 + abs(m - a)
    return 0.9 - m


def test_restarts_leave_a_one_field_optimum_that_descent_cannot():
    obj = Objective(rows=((0,),), predict=lambda g, c: np.array([_valley(c)]), score=lambda p: float(p[0]),
                    size=1)
    start = Calibration(matmul_efficiency=0.5, attention_efficiency=0.5)
    stuck = descend(obj, start, GRID, rounds=5)
    assert (stuck.matmul_efficiency, stuck.attention_efficiency) == (0.5, 0.5)
    found = descend(obj, start, GRID, rounds=5, restarts=40)
    assert _valley(found) < _valley(stuck)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(GRID["matmul_efficiency"]), st.sampled_from(GRID["attention_efficiency"]),
       st.integers(0, 4))
def test_restarts_never_end_above_the_plain_descent(m, a, restarts):
    obj = _objective({"matmul_efficiency": m, "attention_efficiency": a})
    start = Calibration(matmul_efficiency=0.4, attention_efficiency=0.9)
    plain = descend(obj, start, GRID, rounds=1)
    more = descend(obj, start, GRID, rounds=1, restarts=restarts)
    assert obj.score(obj.all_values(more)) <= obj.score(obj.all_values(plain)) + 1e-12
