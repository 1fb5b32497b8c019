"""Pareto utilities against the O(n^2) definition."""

import numpy as np
from hypothesis import given, strategies as st

from meshplan.search.frontier import Front, dominated_by, filter_budget, merge_fronts, pareto_indices, pareto_mask

pts = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=0, max_size=40)


def _naive(points):
    keep = []
    for i, (t, m) in enumerate(points):
        dominated = any((t2 <= t and m2 <= m) and (t2, m2) != (t, m) for t2, m2 in points)
        first_copy = (t, m) not in points[:i]
        if not dominated and first_copy:
            keep.append(i)
    return keep


@given(pts)
def test_pareto_mask_matches_definition(points):
    t = np.array([p[0] for p in points], float)
    m = np.array([p[1] for p in points], float)
    assert sorted(np.flatnonzero(pareto_mask(t, m))) == _naive(points)


@given(pts)
def test_frontier_sorted_and_dominated_by(points):
    t = np.array([p[0] for p in points], float)
    m = np.array([p[1] for p in points], float)
    f = Front.of(t, m, np.arange(t.size))
    assert np.all(np.diff(f.time_s) > 0) and np.all(np.diff(f.memory_bytes) < 0)
    cov = dominated_by(f.time_s, f.memory_bytes, t, m)
    assert cov.all()  # every input point is covered by the frontier
    q = np.array([[x, y] for x in range(-1, 22, 3) for y in range(-1, 22, 3)], float)
    got = dominated_by(f.time_s, f.memory_bytes, q[:, 0], q[:, 1])
    want = [any(a <= x and b <= y for a, b in points) for x, y in q]
    assert list(got) == want


@given(pts, pts)
def test_merge_equals_frontier_of_union(a, b):
    def front(points, base):
        t = np.array([p[0] for p in points], float)
        m = np.array([p[1] for p in points], float)
        return Front.of(t, m, base + np.arange(t.size))
    merged = merge_fronts(front(a, 0), front(b, 1000))
    union = a + b
    direct = Front.of(np.array([p[0] for p in union], float), np.array([p[1] for p in union], float),
                      np.arange(len(union)))
    assert list(zip(merged.time_s, merged.memory_bytes)) == list(zip(direct.time_s, direct.memory_bytes))
    budget = 7.0
    fb = filter_budget(merged, budget)
    assert np.all(fb.memory_bytes <= budget)
    assert len(fb) == int(np.sum(merged.memory_bytes <= budget))


def test_pareto_indices_fastest_first():
    idx = pareto_indices(np.array([3.0, 1.0, 2.0, 2.0]), np.array([1.0, 5.0, 2.0, 9.0]))
    assert list(idx) == [1, 2, 0]
