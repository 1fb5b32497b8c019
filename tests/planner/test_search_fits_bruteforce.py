"""One "fits" in the search and in ``estimate``, under both allocator settings: on small spaces the
search's fitting frontier is exactly the Pareto set, in (step time, the device peak "fits" reads),
of the plans ``estimate`` calls fitting, found by brute force over every plan (every global
configuration x layer split x recomputed count), with the pruning steps on and off
(cost/device_memory.py: fit_bytes; search/group_prune.py, search/prune.py, search/stages.py)."""

import dataclasses
import itertools
from unittest import mock

import numpy as np
from hypothesis import given, settings, strategies as st

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.plan import Recompute
from meshplan.search import planner
from meshplan.search.frontier import pareto_indices
from meshplan.search.space import RECOMPUTES, enumerate_space
from meshplan.search.split_scoring import chunk_split
from meshplan.spec.cluster import GIB
from _compositions import compositions
from test_search_bruteforce import OPTIONS, small_cases


def every_plan(model, cluster, training, calib):
    """(step time, fits figure, plan) of every plan in the space, each scored by estimate()."""
    space = enumerate_space(model, training, cluster.num_gpus, OPTIONS)
    out = []
    for i in range(len(space)):
        pp, vpp = int(space.pp[i]), int(space.vpp[i])
        policy = RECOMPUTES[int(space.recompute[i])]
        for n in compositions(model.num_layers, pp, vpp):
            rs = itertools.product(*[range(k + 1) for k in n]) if policy != Recompute.NONE else [(0,) * pp]
            for r in rs:
                layers, rec = chunk_split(np.array(n), np.array(r), vpp)
                plan = space.plan(i, layers, rec)
                est = estimate(model, cluster, training, plan, calib)
                out.append((est.step_time_s, est.fit_memory_gib * GIB, plan))
    return out


def with_memory(cluster, memory_bytes: float):
    return dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, memory_gib=memory_bytes / GIB))


@settings(max_examples=8, deadline=None)
@given(small_cases(), st.booleans(), st.floats(0.0, 1.0), st.booleans())
def test_fitting_frontier_is_the_brute_force_one(case, expandable, quantile, pruned):
    model, cluster, training = case
    calib = calibration_for(cluster.gpu).replace_fields(allocator_expandable_segments=expandable)
    plans = every_plan(model, cluster, training, calib)
    t = np.array([p[0] for p in plans])
    m = np.array([p[1] for p in plans])
    # A GPU memory that some plans fit and some do not, halfway between two plans' figures (clear
    # of rounding at the edge).
    u = np.unique(m)
    k = int(quantile * (len(u) - 1))
    memory = float((u[k] + u[k + 1]) / 2 if k + 1 < len(u) else u[k] * 1.01)
    small = with_memory(cluster, memory)
    fit = m <= memory
    idx = np.flatnonzero(fit)[pareto_indices(t[fit], m[fit])]
    for i in idx:  # the brute force's fitting plans are the ones estimate calls fitting
        assert estimate(model, small, training, plans[i][2], calib).fits, plans[i][2].notation()
    # pruned: every pruning step on, the group bounds included (small spaces skip them by default)
    with mock.patch.object(planner, "GROUP_PRUNE_MIN_CONFIGS", 0 if pruned else planner.GROUP_PRUNE_MIN_CONFIGS):
        res = planner.search(model, small, training, calib=calib, options=OPTIONS, prune=pruned)
    assert res.budget_bytes == memory
    got_t = np.array([p.step_time_s for p in res.fitting])
    got_m = np.array([p.peak_memory_bytes for p in res.fitting])
    # Every fitting Pareto-optimal plan is on the frontier, and nothing else fitting is.
    assert len(got_t) == len(idx), (len(got_t), len(idx), expandable)
    order = np.argsort(t[idx], kind="stable")
    np.testing.assert_allclose(got_t, t[idx][order], rtol=1e-9)
    np.testing.assert_allclose(got_m, m[idx][order], rtol=1e-9)
    for p in res.fitting:  # and estimate agrees on each plan the search reports
        est = estimate(model, small, training, p.plan, calib)
        assert est.fits, p.plan.notation()
        assert np.isclose(est.fit_memory_gib * GIB, p.peak_memory_bytes, rtol=1e-9)
    for p in res.frontier:  # the frontier's points above the memory are the ones that do not fit
        if p.peak_memory_bytes > memory:
            assert not estimate(model, small, training, p.plan, calib).fits, p.plan.notation()
