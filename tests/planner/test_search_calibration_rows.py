"""Every configuration of the shared runs CSV lies inside the search space, and the search finds
a plan at least as fast as the row's own under the same cost model and memory limit."""

import numpy as np
import pytest

from meshplan.cost import estimate
from meshplan.calib.validate import RUN_SETTINGS, load_runs, setting_calibration
from meshplan.search.planner import search
from meshplan.search.space_membership import canonical, in_space

from meshplan.data.published import runs_csv

CSV = runs_csv("calibration")  # shipped inside the package

SEARCHED_MAX_GPUS = 32
"""Rows up to this many GPUs are searched in full (the larger spaces are checked for membership
only, to keep the test set fast; bench/bench_search.py covers the big searches)."""


@pytest.fixture(scope="module")
def runs():
    runs, _ = load_runs(CSV)
    assert len(runs) > 100
    return runs


def test_every_row_is_inside_the_space(runs):
    outside = [r.row_id for r in runs
               if not in_space(r.model, r.training, r.cluster.num_gpus, canonical(r.plan))]
    assert outside == []


def test_search_beats_or_matches_every_small_row(runs):
    small = [r for r in runs if r.cluster.num_gpus <= SEARCHED_MAX_GPUS]
    assert len(small) >= 10
    for run in small:
        calib = setting_calibration(run, None, RUN_SETTINGS)
        own = estimate(run.model, run.cluster, run.training, run.plan, calib)
        # the row's plan must be allowed: the search's budget is the device peak "fits" reads
        # (cost/device_memory.py: fit_bytes)
        limit = max(run.cluster.gpu.memory_bytes, own.fit_memory_gib * 2**30)
        res = search(run.model, run.cluster, run.training, calib=calib, budget_bytes=limit)
        best = res.recommended
        assert best is not None, run.row_id
        assert best.step_time_s <= own.step_time_s * (1 + 1e-9), (run.row_id, run.plan.notation(),
                                                                    best.plan.notation())
        assert best.peak_memory_bytes <= res.budget_bytes == limit
        assert np.isfinite(best.step_time_s)
