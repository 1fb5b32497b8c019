"""The stage walk with per-step tails (search.stage_tails): the step is alpha (max_s mb_s) +
max_s x_s, and the walk's frontier over that objective equals brute force over every split."""

import itertools

import numpy as np
from hypothesis import example, given, settings, strategies as st

from meshplan.search.frontier import pareto_indices
from meshplan.search.stages import StageTable, relaxed_bounds, stage_frontier
from _compositions import compositions


def _brute(tbl: StageTable, i: int, cap: float) -> set[tuple[float, float]]:
    one = tbl.take(np.array([i]))
    ns, rs = [], []
    for n in compositions(tbl.num_layers, tbl.num_ranks, tbl.chunks):
        for r in itertools.product(*[range(k + 1) if one.allow_recompute[0] else range(1) for k in n]):
            ns.append(n)
            rs.append(r)
    rows = np.zeros(len(ns), dtype=int)
    n, r = np.array(ns, float), np.array(rs, float)
    t = one.take(rows).step_time_s(n, r)
    m = one.take(rows).rank_costs(n, r)[1].max(axis=1)
    t, m = t[m <= cap], m[m <= cap]
    return {(round(t[j], 9), round(m[j], 6)) for j in pareto_indices(t, m)}


@st.composite
def tailed_tables(draw):
    """Small tables whose times hold a per-step tail y_s = n y_a + y_e,s (multiples of 1/8: exact
    sums), the folded times t_s = mb_s + y_s."""
    C = draw(st.integers(1, 3))
    p = draw(st.integers(2, 3))
    v = draw(st.integers(1, 2))
    L = draw(st.integers(p * v, 7))
    ints = lambda lo, hi, k: np.array(draw(st.lists(st.integers(lo, hi), min_size=k, max_size=k)), float)  # noqa: E731
    d = ints(1, 40, C)
    ya, ye = ints(0, 4, C) / 8.0, ints(0, 16, C * p).reshape(C, p) / 8.0
    return StageTable(
        layer_time_s=ints(1, 9, C) / 4.0 + ya, recompute_time_s=ints(0, 5, C) / 4.0,
        layer_static_bytes=ints(0, 30, C), layer_act_bytes=d,
        layer_act_recomputed_bytes=np.floor(d * draw(st.floats(0, 1))),
        rank_time_s=ints(0, 12, C * p).reshape(C, p) / 4.0 + ye, rank_bytes=ints(0, 100, C * p).reshape(C, p),
        inflight=ints(1, 4, C * p).reshape(C, p),
        allow_recompute=np.array(draw(st.lists(st.booleans(), min_size=C, max_size=C))),
        num_layers=L, chunks=v, recompute_jump_bytes=ints(0, 3, C) * draw(st.integers(0, 1)),
        layer_tail_s=ya, rank_tail_s=ye)


def _pinned():
    # two ranks, rank 0 with the larger tail: r = (2, 0) and (2, 1) tie on the folded time (the
    # seed case of tests/planner/test_search_bruteforce.py in miniature), (2, 0) is faster
    return StageTable(
        layer_time_s=np.array([1.0]), recompute_time_s=np.array([0.5]), layer_static_bytes=np.array([0.0]),
        layer_act_bytes=np.array([4.0]), layer_act_recomputed_bytes=np.array([1.0]),
        rank_time_s=np.array([[1.0, 0.0]]), rank_bytes=np.array([[0.0, 0.0]]), inflight=np.array([[2.0, 1.0]]),
        allow_recompute=np.array([True]), num_layers=4, layer_tail_s=np.array([0.0]),
        rank_tail_s=np.array([[1.0, 0.0]]))


@settings(max_examples=300, deadline=None)
@given(tailed_tables(), st.sampled_from([np.inf, 60.0, 20.0]))
@example(_pinned(), np.inf)
def test_tailed_walk_equals_brute_force(tbl, cap):
    pts = stage_frontier(tbl, max_points=10_000, memory_cap_bytes=cap)
    for i in range(tbl.num_configs):
        sel = pts.config == i
        mine = {(round(t, 9), round(m, 6)) for t, m in zip(pts.max_time_s[sel], pts.peak_bytes[sel])}
        assert mine == _brute(tbl, i, cap)
        # every reported split is legal and reproduces its point, fastest first
        assert np.all(pts.layers[sel].sum(axis=1) == tbl.num_layers)
        assert np.all(pts.layers[sel] >= tbl.chunks)
        assert np.all((0 <= pts.recomputed[sel]) & (pts.recomputed[sel] <= pts.layers[sel]))
        again = tbl.take(pts.config[sel]).step_time_s(pts.layers[sel], pts.recomputed[sel])
        np.testing.assert_allclose(again, pts.max_time_s[sel], rtol=1e-9)
        assert np.all(np.diff(pts.max_time_s[sel]) > 0)
    # the folded bounds stay below the objective
    t_rel, _ = relaxed_bounds(tbl)
    assert np.all(pts.max_time_s >= t_rel[pts.config] * (1 - 1e-9))


def test_pinned_tie_is_broken_by_the_tail():
    pts = stage_frontier(_pinned(), max_points=10_000)
    folded = stage_frontier(StageTable(**{**_pinned().__dict__, "layer_tail_s": None, "rank_tail_s": None}),
                            max_points=10_000)
    assert _brute(_pinned(), 0, np.inf) == {(round(t, 9), round(m, 6)) for t, m in zip(pts.max_time_s, pts.peak_bytes)}
    # the folded walk's splits, scored by the step, miss two: it walks n (1, 3) first (step 4.0,
    # 12 bytes), never n (2, 2) with r (0, 0) (3.0, 16) or r (1, 0) (3.5, 10): there rank 0's tail
    # and rank 1's micro-batches are each the largest, and the folded times tie with (1, 3)
    t = _pinned().take(folded.config).step_time_s(folded.layers, folded.recomputed)
    got = {(round(t[j], 9), round(folded.peak_bytes[j], 6)) for j in pareto_indices(t, folded.peak_bytes)}
    assert got != _brute(_pinned(), 0, np.inf)


@settings(max_examples=150, deadline=None)
@given(tailed_tables(), st.integers(1, 4), st.sampled_from([None, 0.3, 0.6]))
def test_tailed_walk_keeps_the_fastest_points_and_what_a_known_plan_does_not_beat(tbl, points, stop_at):
    # max_points (a work limit: each walk, folded or capped, stops there) keeps at most that many
    # points per config, the fastest of them the whole walk's; with keep_going stopping the walks
    # whose next time and least memory a known plan K dominates (the planner's use), every point
    # K does not dominate is still walked, or one at least as good
    whole = stage_frontier(tbl, max_points=10_000)
    if stop_at is None:
        pts = stage_frontier(tbl, max_points=points)
        for i in range(tbl.num_configs):
            sel, ref = pts.config == i, whole.config == i
            assert 1 <= sel.sum() <= points
            assert pts.max_time_s[sel][0] == whole.max_time_s[ref][0]
            assert pts.peak_bytes[sel][0] == whole.peak_bytes[ref][0]
        return
    k_t, k_m = stop_at * whole.max_time_s.max(), float(np.median(whole.peak_bytes))
    pts = stage_frontier(tbl, max_points=10_000, keep_going=lambda rows, t, m: (t < k_t) | (m < k_m))
    for i in range(tbl.num_configs):
        sel, ref = pts.config == i, whole.config == i
        for t, m in zip(whole.max_time_s[ref], whole.peak_bytes[ref]):
            if t < k_t or m < k_m:
                assert np.any((pts.max_time_s[sel] <= t) & (pts.peak_bytes[sel] <= m)), (t, m)
