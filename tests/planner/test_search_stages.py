"""The stage-split frontier equals brute force over every split and every recompute count."""

import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from meshplan.search.frontier import pareto_indices
from meshplan.search.stages import StageTable, corner_bounds, relaxed_bounds, stage_frontier
from _compositions import compositions



def _brute(tbl: StageTable, i: int) -> set[tuple[float, float]]:
    one = tbl.take(np.array([i]))
    ns, rs = [], []
    for n in compositions(tbl.num_layers, tbl.num_ranks, tbl.chunks):
        r_ranges = [range(k + 1) if one.allow_recompute[0] else range(1) for k in n]
        for r in itertools.product(*r_ranges):
            ns.append(n)
            rs.append(r)
    rows = np.zeros(len(ns), dtype=int)
    t, m = one.take(rows).rank_costs(np.array(ns, float), np.array(rs, float))
    pts_t, pts_m = t.max(axis=1), m.max(axis=1)
    idx = pareto_indices(pts_t, pts_m)
    return {(round(pts_t[j], 9), round(pts_m[j], 6)) for j in idx}


@st.composite
def tables(draw):
    C = draw(st.integers(1, 3))
    p = draw(st.integers(1, 3))
    v = draw(st.integers(1, 2))
    L = draw(st.integers(p * v, 7))
    pos = st.floats(0.1, 10.0, allow_nan=False)
    ints = lambda lo, hi: np.array(draw(st.lists(st.integers(lo, hi), min_size=C, max_size=C)), float)  # noqa: E731
    mat = lambda lo, hi: np.array(draw(st.lists(st.integers(lo, hi), min_size=C * p, max_size=C * p)),  # noqa: E731
                                  float).reshape(C, p)
    d = ints(1, 40)
    return StageTable(
        layer_time_s=ints(1, 9) / 4.0, recompute_time_s=ints(0, 5) / 4.0, layer_static_bytes=ints(0, 30),
        layer_act_bytes=d, layer_act_recomputed_bytes=np.floor(d * draw(st.floats(0, 1))),
        rank_time_s=mat(0, 12) / 4.0, rank_bytes=mat(0, 100), inflight=mat(1, 4),
        allow_recompute=np.array(draw(st.lists(st.booleans(), min_size=C, max_size=C))),
        num_layers=L, chunks=v, recompute_jump_bytes=ints(0, 3) * draw(st.integers(0, 1)))


@given(tables())
def test_stage_frontier_equals_brute_force(tbl):
    pts = stage_frontier(tbl, max_points=10_000)
    for i in range(tbl.num_configs):
        mine = {(round(t, 9), round(m, 6)) for t, m, c in zip(pts.max_time_s, pts.peak_bytes, pts.config) if c == i}
        assert mine == _brute(tbl, i)
        # every reported split is legal and reproduces its point
        sel = pts.config == i
        assert np.all(pts.layers[sel].sum(axis=1) == tbl.num_layers)
        assert np.all(pts.layers[sel] >= tbl.chunks)
        assert np.all((0 <= pts.recomputed[sel]) & (pts.recomputed[sel] <= pts.layers[sel]))


@given(tables())
def test_corner_bounds_bound_every_point(tbl):
    t_lb, m_lb = corner_bounds(tbl)
    pts = stage_frontier(tbl, max_points=10_000)
    assert np.all(pts.max_time_s >= t_lb[pts.config] - 1e-9)
    t_rel, m_rel = relaxed_bounds(tbl)
    assert np.all(t_rel <= t_lb * (1 + 1e-9)) and np.all(m_rel <= m_lb * (1 + 1e-9) + 1e-9)
    assert np.all(pts.peak_bytes >= m_lb[pts.config] - 1e-6)
    # both corners are attained: the first point is the fastest, the last the leanest
    for i in range(tbl.num_configs):
        sel = pts.config == i
        assert np.isclose(pts.max_time_s[sel].min(), t_lb[i])
        assert np.isclose(pts.peak_bytes[sel].min(), m_lb[i])


def test_embedding_and_head_ranks_get_fewer_layers():
    # 4 ranks, 16 layers; rank 0 carries an embedding and rank 3 a large LM head (time and memory).
    tbl = StageTable(
        layer_time_s=np.array([1.0]), recompute_time_s=np.array([0.3]), layer_static_bytes=np.array([10.0]),
        layer_act_bytes=np.array([4.0]), layer_act_recomputed_bytes=np.array([1.0]),
        rank_time_s=np.array([[1.0, 0.0, 0.0, 3.0]]), rank_bytes=np.array([[20.0, 0.0, 0.0, 40.0]]),
        inflight=np.array([[4.0, 3.0, 2.0, 1.0]]), allow_recompute=np.array([False]), num_layers=16)
    pts = stage_frontier(tbl)
    fastest = np.argmin(pts.max_time_s)
    n = pts.layers[fastest]
    assert n[3] < n[1] and n[0] <= n[1] and n.sum() == 16


@given(tables(), st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_mixed_chunks_per_config_equal_one_table_each(tbl, vs):
    # A table whose configs have different v (one group per pipeline degree in the planner)
    # walks the same frontier for each config as a table of that config alone.
    vs = np.array(vs[: tbl.num_configs])
    vs = np.minimum(vs, tbl.num_layers // tbl.num_ranks)
    mixed = StageTable(**{**tbl.__dict__, "chunks": vs})
    pts = stage_frontier(mixed, max_points=10_000)
    t_rel, _ = relaxed_bounds(mixed)
    for i in range(tbl.num_configs):
        one = StageTable(**{**tbl.take(np.array([i])).__dict__, "chunks": int(vs[i])})
        alone = stage_frontier(one, max_points=10_000)
        sel = pts.config == i
        assert np.allclose(pts.max_time_s[sel], alone.max_time_s)
        assert np.allclose(pts.peak_bytes[sel], alone.peak_bytes)
        assert np.array_equal(pts.layers[sel], alone.layers)
        assert np.all(pts.layers[sel] >= vs[i])
        assert np.isclose(t_rel[i], relaxed_bounds(one)[0][0])


@st.composite
def deep_tables(draw):
    """Tables with many layers per rank and uneven ranks (in-flight counts, embedding / head
    intercepts), where the truncated grids of ``stage_frontier`` stop well short of L."""
    C = draw(st.integers(1, 4))
    p = draw(st.integers(1, 6))
    L = draw(st.integers(3 * p, 48))
    pos = lambda lo, hi, size: np.array(draw(st.lists(st.floats(lo, hi, allow_nan=False, allow_subnormal=False),  # noqa: E731
                                                       min_size=size, max_size=size)))
    d = pos(0.0, 50.0, C)
    chunks = np.array(draw(st.lists(st.integers(1, 3), min_size=C, max_size=C)))
    return StageTable(
        layer_time_s=pos(0.1, 3.0, C), recompute_time_s=pos(0.0, 1.5, C), layer_static_bytes=pos(0.0, 40.0, C),
        layer_act_bytes=d, layer_act_recomputed_bytes=d * pos(0.0, 1.0, C),
        rank_time_s=pos(0.0, 20.0, C * p).reshape(C, p), rank_bytes=pos(0.0, 500.0, C * p).reshape(C, p),
        inflight=np.array(draw(st.lists(st.integers(1, 2 * p), min_size=C * p, max_size=C * p)),
                          float).reshape(C, p),
        allow_recompute=np.array(draw(st.lists(st.booleans(), min_size=C, max_size=C))),
        num_layers=L, chunks=chunks if draw(st.booleans()) else int(chunks.min()),
        recompute_jump_bytes=pos(0.0, 30.0, C) * draw(st.integers(0, 1)))


@settings(max_examples=150, deadline=None)
@given(deep_tables(), st.sampled_from([np.inf, 2000.0, 600.0]), st.integers(1, 40))
def test_truncated_grids_walk_the_same_points(tbl, cap, points):
    # Cutting the grids at the layer counts that can matter (stages._top) changes no point, no
    # split: the walk equals the one over every layer count, bit for bit.
    full = stage_frontier(tbl, max_points=points, memory_cap_bytes=cap, truncate=False)
    cut = stage_frontier(tbl, max_points=points, memory_cap_bytes=cap, truncate=True)
    for f in ("config", "max_time_s", "peak_bytes", "layers", "recomputed"):
        assert np.array_equal(getattr(cut, f), getattr(full, f)), f


@settings(max_examples=150, deadline=None)
@given(deep_tables(), st.sampled_from([np.inf, 2000.0, 600.0]), st.integers(1, 40), st.sampled_from([None, 0.5]))
def test_walk_one_chunk_count_at_a_time_is_the_whole_walk(tbl, cap, points, stop_at):
    # A table of several virtual-stage counts walked one count at a time (stages._walk_by_chunks,
    # what stage_frontier does on large grids) gives the points of the walk over the whole table,
    # bit for bit and in the same order (step, then config: ties between configs resolve the
    # same); keep_going is asked about the same rows (stop_at: configs stop once their next
    # point is slower than that fraction of their first rank's intercept plus L layers).
    from meshplan.search import stages

    if stop_at is None:
        keep = None
    else:
        limit = stop_at * (tbl.rank_time_s[:, 0] + tbl.num_layers * tbl.layer_time_s)
        keep = lambda rows, t_next, m_floor: t_next <= limit[rows]  # noqa: E731
    with stages._quiet():
        whole = stages._walk(tbl, points, keep, cap, None)
        split = stages._walk_by_chunks(tbl, points, keep, cap, None)
    for f in ("config", "max_time_s", "peak_bytes", "layers", "recomputed"):
        assert np.array_equal(getattr(split, f), getattr(whole, f)), f


@st.composite
def one_rank_tables(draw):
    """pp = 1 tables (one rank holding all L layers), shallow and deep, with mixed v."""
    tbl = draw(deep_tables())
    C, L = tbl.num_configs, tbl.num_layers
    return StageTable(**{**tbl.__dict__, "rank_time_s": tbl.rank_time_s[:, :1], "rank_bytes": tbl.rank_bytes[:, :1],
                         "inflight": tbl.inflight[:, :1], "num_layers": draw(st.integers(1, L)),
                         "chunks": tbl.chunks if np.ndim(tbl.chunks) == 0 else tbl.chunks[:C]})


@settings(max_examples=300, deadline=None)
@given(one_rank_tables(), st.sampled_from([np.inf, 2000.0, 600.0, 150.0]), st.integers(1, 60),
       st.sampled_from([None, 0.5, 0.8]))
def test_one_rank_walk_is_the_whole_grid_walk(tbl, cap, points, stop_at):
    # A pp = 1 table is walked on the grid's last column alone (stages._walk_one_rank, what
    # stage_frontier does for one rank; configs whose layers cost next to nothing on the whole
    # grid): the same points, splits and order as the walk over every layer count, whole or cut
    # (stages._walk), bit for bit, with keep_going asked the same rows.
    from meshplan.search import stages

    tbl = StageTable(**{**tbl.__dict__, "chunks": np.minimum(tbl.chunk_array(), tbl.num_layers)
                        if np.ndim(tbl.chunks) else min(int(tbl.chunks), tbl.num_layers)})
    asked = {}

    def keeper(tag):
        if stop_at is None:
            return None
        limit = stop_at * (tbl.rank_time_s[:, 0] + tbl.num_layers * tbl.layer_time_s)

        def keep(rows, t_next, m_floor):
            asked.setdefault(tag, []).append((rows.copy(), t_next.copy(), m_floor.copy()))
            return t_next <= limit[rows]
        return keep

    with stages._quiet():
        one = stages._walk_one_rank_table(tbl, points, keeper("one"), cap, None)
        for truncate in (False, True):
            asked.pop("whole", None)
            whole = stages._walk(tbl, points, keeper("whole"), cap, truncate)
            for f in ("config", "max_time_s", "peak_bytes", "layers", "recomputed"):
                assert np.array_equal(getattr(one, f), getattr(whole, f)), (f, truncate)
            if len(asked.get("one", [])) != len(asked.get("whole", [])):  # (split in parts: asked per part)
                continue
            for a, b in zip(asked.get("one", []), asked.get("whole", []), strict=True):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
