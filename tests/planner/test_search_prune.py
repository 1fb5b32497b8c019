"""Pruning before the full estimate (``meshplan.search.prune``) and the stage grids cut short
(``stages._top``) change nothing: the frontier (times, memories, plans) equals the search that
scores every configuration in full and walks every grid whole (``search(..., prune=False)``)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost.calibration import calibration_for
from meshplan.search.even import EvenCost, balanced_slice, even_slice
from meshplan.search.planner import search
from meshplan.search.prune import EvenPoints, prunable, settle
from meshplan.search.frontier import Front
from meshplan.search.space import enumerate_space
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.spec.cluster import cluster_for_gpu, system_preset
from meshplan.spec.model import ModelSpec, Position
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def _frontier(res):
    return [(p.step_time_s, p.peak_memory_bytes, p.plan) for p in res.frontier]


def _same_search(model, cluster, training):
    pruned = search(model, cluster, training, prune=True)
    full = search(model, cluster, training, prune=False)
    assert _frontier(pruned) == _frontier(full)
    assert pruned.recommended == full.recommended
    assert full.pruned_configs == 0
    return pruned


@st.composite
def jobs(draw):
    heads = draw(st.sampled_from([8, 16, 32]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    moe = draw(st.integers(0, 3)) == 0
    model = ModelSpec(
        name="rand", num_layers=draw(st.integers(2, 48)), hidden_size=hidden, num_heads=heads,
        num_kv_heads=draw(st.sampled_from([heads, heads // 4])), ffn_hidden_size=4 * hidden,
        gated_mlp=draw(st.booleans()), vocab_size=draw(st.sampled_from([32000, 128256])), position=Position.ROPE,
        **(dict(moe_num_experts=8, moe_top_k=2) if moe else {}))
    cluster = cluster_for_gpu(draw(st.sampled_from(["h100-sxm", "a100-40gb"])),
                              gpus_per_node=8).with_gpus(draw(st.sampled_from([1, 4, 8, 16, 32, 64])))
    training = TrainingSpec(seq_len=draw(st.sampled_from([1024, 4096, 32768])),
                            global_batch=draw(st.sampled_from([8, 32, 128])))
    return model, cluster, training


@settings(max_examples=25, deadline=None)
@given(jobs())
def test_pruned_search_equals_full_search(job):
    _same_search(*job)


@pytest.mark.parametrize("model, system, nodes, seq, batch", [
    ("llama3-70b", "dgx-h100", 16, 8192, 512),  # dense, deep pipelines (cut grids)
    ("mixtral-8x7b", "dgx-h100", 8, 4096, 256),  # MoE: expert parallel and expert tp
    ("llama3-8b", "dgx-h100", 8, 131072, 16),  # long context: context parallel, little memory
])
def test_pruned_search_equals_full_search_on_published_models(model, system, nodes, seq, batch):
    res = _same_search(model_preset(model), system_preset(system, num_nodes=nodes),
                       TrainingSpec(seq_len=seq, global_batch=batch))
    assert res.pruned_configs > 0.5 * res.global_configs  # the pruning did work here


@pytest.mark.parametrize("model, gpus", [("llama3-8b", 64), ("mixtral-8x7b", 32)])
def test_balanced_rank_bounds_the_even_split(model, gpus):
    # the mean rank (L / p layers, no embedding, no head) is below the even split in both
    # figures, and with one rank it is the even split itself (the bound below every uneven
    # split too: test_search_bruteforce.test_balanced_bound_is_below_every_split)
    spec, cluster = model_preset(model), cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(gpus)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    ctx = CostContext(spec, cluster, training, calibration_for(cluster.gpu))
    space = enumerate_space(spec, training, gpus)
    layer = shared_layer_cost(ctx, space).take(slice(None))
    full, bound = even_slice(ctx, space, layer), balanced_slice(ctx, space, layer)
    assert np.all(bound.step_time_s <= full.step_time_s) and np.all(bound.peak_memory_bytes <= full.peak_memory_bytes)
    one = space.pp == 1
    assert one.any() and (~one).any()
    assert np.array_equal(bound.step_time_s[one], full.step_time_s[one])
    assert np.array_equal(bound.peak_memory_bytes[one], full.peak_memory_bytes[one])
    assert np.any(bound.step_time_s[~one] < full.step_time_s[~one])


def test_prunable_needs_a_strictly_better_point_and_a_fitting_faster_one():
    known = Front.of(np.array([1.0, 2.0]), np.array([10.0, 5.0]), np.array([0, 1]))
    t = np.array([2.3, 2.3, 1.05, 3.0])
    m = np.array([5.6, 5.4, 11.5, 20.0])
    # shrink 1/1.1: (2.09, 5.09) beaten by (2, 5); (2.09, 4.9) is not; (0.95, 10.45) is faster than all
    got = prunable(known, t, m, shrink=1 / 1.1, fastest_fitting_s=0.0)
    assert got.tolist() == [True, False, False, True]
    # a configuration faster than the fastest fitting plan may be held back for offload: kept
    assert prunable(known, t, m, shrink=1 / 1.1, fastest_fitting_s=2.5).tolist() == [False, False, False, True]
    assert not prunable(known, t, m, shrink=0.0, fastest_fitting_s=0.0).any()


def test_settle_scores_every_row_a_known_plan_does_not_beat():
    rng = np.random.default_rng(7)
    exact_t, exact_m = rng.uniform(1, 10, 5000), rng.uniform(1, 10, 5000)
    bound = EvenPoints(exact_t * rng.uniform(0.7, 1.0, 5000), exact_m * rng.uniform(0.7, 1.0, 5000),
                       np.zeros(5000), exact=rng.random(5000) < 0.1)
    bound.step_time_s[bound.exact] = exact_t[bound.exact]
    bound.peak_memory_bytes[bound.exact] = exact_m[bound.exact]
    pts, scored = settle(bound, lambda rows: (exact_t[rows], exact_m[rows], np.zeros(rows.size)),
                         shrink=1 / 1.1, budget_bytes=5.0)
    done = pts.exact
    assert 0 < scored < 5000 and scored == np.count_nonzero(done & ~bound.exact)
    np.testing.assert_array_equal(pts.step_time_s[done], exact_t[done])
    # every row left with its bound: a scored point beats it after the shrink, and it is no
    # faster than the fastest scored point that fits the budget
    known = Front.of(exact_t[done], exact_m[done], np.flatnonzero(done))
    fastest_fitting = known.time_s[known.memory_bytes <= 5.0].min()
    assert prunable(known, pts.step_time_s[~done], pts.peak_memory_bytes[~done], shrink=1 / 1.1,
                    fastest_fitting_s=fastest_fitting).all()
    # and the frontier of all points is the frontier of the exact ones
    front = Front.of(exact_t, exact_m, np.arange(5000))
    assert set(front.key) <= set(np.flatnonzero(done))


def test_pruned_search_equals_full_search_on_a_heavy_head():
    # the case the balanced-rank bound was made for (a 32K-vocabulary head on the last of two
    # ranks, 4 small layers): the refinement test reads the bound, and so must the pruning
    model = ModelSpec(name="heavy-head", num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=4,
                      ffn_hidden_size=1024, gated_mlp=False, vocab_size=32000, moe_num_experts=4, moe_top_k=2)
    _same_search(model, cluster_for_gpu("a100-40gb", gpus_per_node=2).with_gpus(2),
                 TrainingSpec(seq_len=2048, global_batch=8))


def test_refinement_test_reads_the_balanced_time():
    # row 0: even point (2.0, 10), balanced bound 1.5; row 1: (2.0, 10), bound 1.9; the frontier
    # point (1.7, 8) beats both even points shrunk by 1/1.1 (1.82, 9.09), not row 0's bound
    cost = EvenCost(step_time_s=np.array([2.0, 2.0]), peak_memory_bytes=np.array([10.0, 10.0]),
                    host_memory_bytes=np.zeros(2), balanced_time_s=np.array([1.5, 1.9]))
    front = Front.of(np.array([1.7]), np.array([8.0]), np.array([7]))
    assert cost.near(front, 1 / 1.1).tolist() == [False, False]
    assert cost.candidates(front, 1 / 1.1).tolist() == [True, False]
    # a row left with its bound is no candidate, whatever its balanced time
    bounded = EvenCost(step_time_s=np.array([2.0, 2.0]), peak_memory_bytes=np.array([10.0, 10.0]),
                       host_memory_bytes=np.zeros(2), balanced_time_s=np.array([1.5, 1.5]),
                       exact=np.array([True, False]))
    assert bounded.candidates(front, 1 / 1.1).tolist() == [True, False]


@st.composite
def moe_jobs(draw):
    """MoE models as the MoE presets are built: experts over ep with their own tp, leading dense
    layers and an MTP module (ranks charged their own kinds: cost/rank_layers.py), Megatron's
    recompute module sets, every schedule (interleaved uneven chunks: the chunk weights)."""
    from meshplan.plan import RecomputeModule, Schedule
    from meshplan.search.space import SearchOptions

    heads = draw(st.sampled_from([8, 16]))
    hidden = heads * 64
    layers = draw(st.integers(4, 24))
    model = ModelSpec(
        name="rand-moe", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads // 4,
        ffn_hidden_size=4 * hidden, gated_mlp=True, vocab_size=draw(st.sampled_from([32000, 151936])),
        position=Position.ROPE, moe_num_experts=draw(st.sampled_from([8, 16, 32])),
        moe_top_k=draw(st.sampled_from([2, 4])), moe_ffn_hidden_size=draw(st.sampled_from([hidden // 2, hidden])),
        moe_dense_layers=draw(st.sampled_from([0, 1, 3])) % layers, mtp_num_layers=draw(st.sampled_from([0, 1])))
    gpu = draw(st.sampled_from(["h100-sxm", "gb200"]))
    gpus = draw(st.sampled_from([8, 16, 32]))
    cluster = cluster_for_gpu(gpu, gpus_per_node=8 if gpu != "gb200" else 4).with_gpus(gpus)
    training = TrainingSpec(seq_len=draw(st.sampled_from([2048, 4096])), global_batch=draw(st.sampled_from([32, 128])))
    sets = ((RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),
            (RecomputeModule.CORE_ATTN, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM))
    # OSDP pass on: the mismatch seen in session 8 (an OSDP point, pp1 cp8 tp4 ZeRO-3 head_splits 8,
    # 3.3124 s pruned vs 3.3138 s full, seed 191065269169500597249773634097286983462) reproduced
    # on 6a8e6f5 once, not on 1472020 (that seed, and 60 more examples); cause not pinned.
    options = SearchOptions(schedules=tuple(s for s in Schedule if s != Schedule.ZERO_BUBBLE),
                            recompute_module_sets=draw(st.sampled_from([(), sets])), osdp=True)
    return model, cluster, training, options


@settings(max_examples=10, deadline=None)
@given(moe_jobs())
def test_pruned_search_equals_full_search_on_moe_models(job):
    model, cluster, training, options = job
    pruned = search(model, cluster, training, options=options, prune=True)
    full = search(model, cluster, training, options=options, prune=False)
    assert _frontier(pruned) == _frontier(full)
    assert pruned.recommended == full.recommended
