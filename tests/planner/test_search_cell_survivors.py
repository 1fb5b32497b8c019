"""The cells that survive the seeding rounds (``meshplan.search.cell_survivors.surviving``),
found block by block (corners first, cells of the blocks a corner does not settle), are those a
pass over every cell finds: the same cells, frontier lookups, known plans and scored count, on
drawn bounds whose small integer values tie often, and on real MoE jobs."""

import numpy as np
from hypothesis import given, settings, strategies as st

from meshplan.cost.calibration import calibration_for
from meshplan.export.common import search_options_for
from meshplan.plan import RecomputeModule
from meshplan.search.cell_survivors import GROUP_SEED_GROUPS, GROUP_SEED_ROUNDS, beaten_at_s, surviving
from meshplan.search.frontier import Front, pareto_indices
from meshplan.search.group_prune import GroupBounds, group_bounds, prune_groups
from meshplan.search.prune import prunable
from meshplan.search.even import even_estimate
from meshplan.search.space import SearchOptions, cross_groups, enumerate_groups, take_groups
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODULE_SETS = ((RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),)


def _surviving_whole(groups, bounds, score, *, shrink, budget_bytes):
    """The rounds over every cell of the whole (groups, sizes, choices) arrays (session 12's
    ``group_prune.surviving``): (alive cells, beaten_at_s of each, known front, fastest fitting,
    scored)."""
    t_cell, m_cell = bounds.time_s.reshape(-1), bounds.memory_bytes.reshape(-1)
    alive = np.isfinite(t_cell)
    per_group = t_cell.size // bounds.shape[0]
    seen = np.zeros(bounds.shape[0], dtype=bool)
    known, fastest = Front.empty(), np.inf
    scored = 0
    live = np.flatnonzero(alive)
    live_t, live_m = t_cell[live], m_cell[live]
    for round_ in range(GROUP_SEED_ROUNDS):
        unseen = ~seen[live // per_group]
        open_, open_t = live[unseen], live_t[unseen]
        if open_.size == 0:
            break
        if round_ == 0:
            cells = open_[pareto_indices(open_t, live_m[unseen])]
        else:
            cells = open_[np.argpartition(open_t, min(GROUP_SEED_GROUPS, open_.size) - 1)[:GROUP_SEED_GROUPS]]
        pick = np.unique(cells // per_group)
        seen[pick] = True
        t, m = score(take_groups(groups, pick))
        scored += t.size
        known = Front.of(np.concatenate([known.time_s, t]), np.concatenate([known.memory_bytes, m]),
                         np.arange(known.time_s.size + t.size))
        fits = known.memory_bytes <= budget_bytes
        fastest = float(known.time_s[fits].min()) if fits.any() else np.inf
        still = ~prunable(known, live_t, live_m, shrink=shrink, fastest_fitting_s=fastest)
        live, live_t, live_m = live[still], live_t[still], live_m[still]
    out = np.zeros(t_cell.size, dtype=bool)
    out[live] = True
    beaten = np.full(t_cell.size, np.inf)
    beaten[live] = beaten_at_s(known, live_m, shrink)
    return out.reshape(bounds.shape), beaten.reshape(bounds.shape), known, fastest, scored


def _assert_same(groups, bounds, score, shrink, budget):
    keep, scored = surviving(groups, bounds, score, shrink=shrink, budget_bytes=budget)
    alive, beaten, known, fastest, want_scored = _surviving_whole(groups, bounds, score, shrink=shrink,
                                                                  budget_bytes=budget)
    got = np.zeros(bounds.shape, dtype=bool)
    got[keep.groups] = keep.cells
    assert np.array_equal(got, alive)
    assert np.array_equal(np.flatnonzero(alive.any(axis=(1, 2))), keep.groups)  # only groups with a kept cell
    assert scored == want_scored
    assert np.array_equal(keep.known.time_s, known.time_s) and np.array_equal(keep.known.memory_bytes,
                                                                               known.memory_bytes)
    assert keep.fastest_fitting_s == fastest
    if keep.beaten_at_s is None:  # (no live cell: nothing to look up)
        assert not alive.any()
    else:
        assert np.array_equal(keep.beaten_at_s[keep.cells], beaten[keep.groups][keep.cells])
    return keep


@st.composite
def drawn_bounds(draw):
    g_n, s_n = draw(st.integers(1, 40)), draw(st.integers(1, 4))
    c_n, k_n = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    small = lambda *shape: rng.integers(0, 4, shape).astype(float)  # noqa: E731 (ties everywhere)
    per_layer = small(k_n, s_n, c_n) + 1
    per_layer[rng.random(per_layer.shape) < 0.05] = np.inf  # cells never alive
    bounds = GroupBounds(
        key_of=rng.integers(0, k_n, g_n), per_layer_s=per_layer, act_policy_bytes=small(k_n, s_n, c_n),
        act_extra_bytes=small(k_n, s_n, c_n), fewest_layers=small(g_n) + 1, cycles=small(g_n, s_n) + 1,
        held_layers=small(g_n, s_n) + 1, tail_s=small(g_n), fixed_bytes=small(g_n) + 1,
        legal=rng.random((g_n, s_n)) < 0.8, overhead_s=float(draw(st.integers(0, 2))), reserve=1.0)
    # the exact points a scored group gives: small integers too, so that they tie with the cells
    points = [(small(n) + 2, small(n) + 2) for n in rng.integers(0, 4, g_n)]

    def score(groups):
        ids = groups["id"]
        return (np.concatenate([points[i][0] for i in ids] + [np.empty(0)]),
                np.concatenate([points[i][1] for i in ids] + [np.empty(0)]))

    return {"id": np.arange(g_n)}, bounds, score


@settings(max_examples=300, deadline=None)
@given(drawn_bounds(), st.sampled_from([1.0, 1 / 1.1, 0.5]), st.sampled_from([0.0, 6.0, np.inf]))
def test_block_rounds_keep_what_the_whole_pass_keeps(drawn, shrink, budget):
    groups, bounds, score = drawn
    _assert_same(groups, bounds, score, shrink, budget)


@settings(max_examples=100, deadline=None)
@given(drawn_bounds())
def test_corners_are_below_each_blocks_cells(drawn):
    # the time corner is the least cell time; the memory corner at most the least cell memory
    _, bounds, _ = drawn
    t_lo, m_lo = bounds.corners()
    t, m = bounds.time_s, bounds.memory_bytes
    assert np.array_equal(t_lo, t.min(axis=2)) and np.all(m_lo <= m.min(axis=2))
    assert np.array_equal(np.isfinite(m_lo), np.isfinite(m.min(axis=2)))


def test_block_rounds_on_moe_jobs():
    # real bounds and the search's own scoring (the even pass over the seed groups), Megatron's
    # space and meshplan's with module sets
    for name, gpu, gpus, target in (("mixtral-8x7b", "h100-sxm", 64, None),
                                    ("mixtral-8x7b", "h100-sxm", 64, "megatron"),
                                    ("qwen3-30b-a3b", "gb200", 32, "megatron")):
        model, training = model_preset(name), TrainingSpec(seq_len=4096, global_batch=256)
        cluster = cluster_for_gpu(gpu, gpus_per_node=4 if gpu == "gb200" else 8).with_gpus(gpus)
        options = search_options_for(target) if target else SearchOptions(recompute_module_sets=MODULE_SETS)
        ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
        groups = enumerate_groups(model, training, gpus, options)
        bounds = group_bounds(ctx, groups, options)

        def ranked(seed):  # points by the seeds' order alone
            return (np.arange(1.0, 1.0 + seed["pp"].size) * 1e-3, np.arange(1.0, 1.0 + seed["pp"].size) * 1e9)

        budget = cluster.gpu.memory_bytes
        keep, _ = prune_groups(ctx, groups, options, shrink=1 / 1.1, budget_bytes=budget)
        assert 0 < keep.cells.sum() < np.isfinite(bounds.time_s).sum()
        # the same rounds from the whole arrays, scoring as prune_groups does
        def score(seed):
            plans = cross_groups(seed, model, training, options)
            est, _ = even_estimate(ctx, plans, shared_layer_cost(ctx, plans), prune_shrink=1 / 1.1,
                                   budget_bytes=budget)
            return est.step_time_s[est.exact], est.peak_memory_bytes[est.exact]

        _assert_same(groups, bounds, score, 1 / 1.1, budget)
        _assert_same(groups, bounds, ranked, 1 / 1.1, budget)
