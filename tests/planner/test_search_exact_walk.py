"""The stage walk is exact: a configuration's staircase longer than any fixed cap reaches the
search's frontier whole (stage_walk._jump skips only points a known plan beats; the cap, when a
caller sets one, counts only the others). Before session 13 the walk stopped each configuration
after STAGE_POINTS_PER_CONFIG (12) steps, beaten steps included, and this case lost a point."""

import numpy as np

from meshplan.plan import Recompute, Schedule
from meshplan.search.planner import search
from meshplan.search.space import SearchOptions
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec
from test_search_bruteforce import brute_force


def _deep_case():
    # 20 layers on two ranks, full recompute per layer: each configuration's staircase (layers
    # and recomputed layers per rank) has more points than the old 12-step cap; pp = 2 alone
    # (``allow``) so that no pp = 1 plan covers them, and the brute force stays ~3k plans.
    model = ModelSpec(name="deep", num_layers=20, hidden_size=1024, num_heads=8, num_kv_heads=8,
                      ffn_hidden_size=4096, gated_mlp=False, vocab_size=32000)
    cluster = cluster_for_gpu("a100-40gb", gpus_per_node=2).with_gpus(2)
    training = TrainingSpec(seq_len=2048, global_batch=2)
    options = SearchOptions(schedules=(Schedule.ONE_F_ONE_B,), recomputes=(Recompute.FULL,), max_vpp=1,
                            offloads=(), vocab_parallel=False, osdp=False, max_cp=1,
                            allow=lambda space: space.pp == 2)
    return model, cluster, training, options


def _frontier(res):
    return (np.array([p.step_time_s for p in res.frontier]), np.array([p.peak_memory_bytes for p in res.frontier]))


def test_default_walk_equals_brute_force_on_a_long_staircase():
    model, cluster, training, options = _deep_case()
    bt, bm, count = brute_force(model, cluster, training, options)
    res = search(model, cluster, training, options=options)
    cap = max(res.budget_bytes, cluster.gpu.memory_bytes)
    st_, sm = _frontier(res)
    below, keep = sm <= cap, bm <= cap
    assert keep.sum() > 12  # (a staircase longer than the old cap)
    assert below.sum() == keep.sum(), (below.sum(), keep.sum())
    np.testing.assert_allclose(st_[below], bt[keep], rtol=1e-9)
    np.testing.assert_allclose(sm[below], bm[keep], rtol=1e-9)


def test_a_cap_counts_only_points_no_known_plan_beats():
    # With a cap, a config walks up to that many points no known plan beats; a cap of the
    # frontier's length loses nothing here (the old cap counted every step, beaten ones too).
    model, cluster, training, options = _deep_case()
    whole = _frontier(search(model, cluster, training, options=options, stage_points=None))
    capped = _frontier(search(model, cluster, training, options=options, stage_points=len(whole[0])))
    np.testing.assert_array_equal(capped[0], whole[0])
    np.testing.assert_array_equal(capped[1], whole[1])
    fewer = _frontier(search(model, cluster, training, options=options, stage_points=2))
    assert fewer[0].size < whole[0].size
