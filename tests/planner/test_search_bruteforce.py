"""On small spaces the searched frontier equals brute force over every plan, each scored by
``meshplan.cost.estimate`` (every global configuration x every per-rank layer split x every
per-rank count of recomputed layers)."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.cost.rank_layers import needs_rank_mix
from meshplan.search.even import balanced_slice, even_slice
from meshplan.plan import Recompute
from meshplan.search.frontier import pareto_indices
from meshplan.search.planner import search
from meshplan.search.space import RECOMPUTES, SearchOptions, enumerate_space
from meshplan.search.split_scoring import chunk_split
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec
from _compositions import compositions



def brute_force(model, cluster, training, options):
    """(step time, peak bytes) of every plan in the space, scored one by one with estimate(); the
    peak is the device figure "fits" reads, the search's (cost.device_memory.fit_bytes)."""
    space = enumerate_space(model, training, cluster.num_gpus, options)
    times, mems = [], []
    for i in range(len(space)):
        pp, vpp = int(space.pp[i]), int(space.vpp[i])
        policy = RECOMPUTES[int(space.recompute[i])]
        for n in compositions(model.num_layers, pp, vpp):
            rs = itertools.product(*[range(k + 1) for k in n]) if policy != Recompute.NONE else [(0,) * pp]
            for r in rs:
                layers, rec = chunk_split(np.array(n), np.array(r), vpp)
                est = estimate(model, cluster, training, space.plan(i, layers, rec))
                times.append(est.step_time_s)
                mems.append(est.fit_memory_gib * 2**30)
    t, m = np.array(times), np.array(mems)
    idx = pareto_indices(t, m)
    return t[idx], m[idx], t.size


@st.composite
def small_cases(draw):
    heads = draw(st.sampled_from([4, 8]))
    hidden = heads * draw(st.sampled_from([64, 128, 256]))
    model = ModelSpec(
        name="rand", num_layers=draw(st.integers(2, 4)), hidden_size=hidden, num_heads=heads,
        num_kv_heads=draw(st.sampled_from([heads, heads // 2])), ffn_hidden_size=4 * hidden,
        gated_mlp=draw(st.booleans()), vocab_size=draw(st.sampled_from([8000, 32000])),
        **(dict(moe_num_experts=4, moe_top_k=2) if draw(st.integers(0, 3)) == 0 else {}))
    gpus = draw(st.sampled_from([1, 2, 4]))
    per_node = draw(st.sampled_from([2, 4]))
    cluster = cluster_for_gpu(draw(st.sampled_from(["h100-sxm", "a100-40gb"])),
                              gpus_per_node=per_node).with_gpus(gpus)
    training = TrainingSpec(seq_len=draw(st.sampled_from([512, 2048])),
                            global_batch=draw(st.sampled_from([2, 4, 8])))
    return model, cluster, training


def _seed_case():
    # hypothesis seed 308895570115885929309294243342861125709 (session 10): 4 layers, 2 A100-40GB.
    model = ModelSpec(name="rand", num_layers=4, hidden_size=2048, num_heads=8, num_kv_heads=4,
                      ffn_hidden_size=8192, gated_mlp=False, vocab_size=8000)
    cluster = cluster_for_gpu("a100-40gb", gpus_per_node=2).with_gpus(2)
    return model, cluster, TrainingSpec(seq_len=512, global_batch=4)


OPTIONS = SearchOptions(max_vpp=2, offloads=(), vocab_parallel=False, osdp=False)  # the brute force enumerates none


@settings(max_examples=8, deadline=None)
@given(small_cases())
def test_frontier_equals_brute_force(case):
    model, cluster, training = case
    bt, bm, count = brute_force(model, cluster, training, OPTIONS)
    res = search(model, cluster, training, options=OPTIONS, refine_slack=float("inf"),
                 memory_cap_bytes=float("inf"), stage_points=10_000)
    st_ = np.array([p.step_time_s for p in res.frontier])
    sm = np.array([p.peak_memory_bytes for p in res.frontier])
    assert count >= len(res.frontier)
    # Same frontier: every brute-force point is matched by a searched point and vice versa.
    assert len(st_) == len(bt), (len(st_), len(bt))
    np.testing.assert_allclose(st_, bt, rtol=1e-9)
    np.testing.assert_allclose(sm, bm, rtol=1e-9)
    # And the reported plans really cost what the frontier says.
    for p in res.frontier[:3]:
        est = estimate(model, cluster, training, p.plan)
        assert np.isclose(est.step_time_s, p.step_time_s, rtol=1e-9)
        assert np.isclose(est.fit_memory_gib * 2**30, p.peak_memory_bytes, rtol=1e-9)


@settings(max_examples=8, deadline=None)
@given(small_cases())
@example(_seed_case())
def test_default_settings_equal_brute_force_below_gpu_memory(case):
    # The default work limits (REFINE_SLACK, STAGE_POINTS_PER_CONFIG, the memory cap of the
    # stage walk) lose nothing on small spaces: the frontier up to the GPU memory (the cap) is
    # the brute-force one (points above it are only even splits, kept for the plot).
    model, cluster, training = case
    bt, bm, _ = brute_force(model, cluster, training, OPTIONS)
    res = search(model, cluster, training, options=OPTIONS)
    cap = max(res.budget_bytes, cluster.gpu.memory_bytes)
    below = [p for p in res.frontier if p.peak_memory_bytes <= cap]
    st_ = np.array([p.step_time_s for p in below])
    sm = np.array([p.peak_memory_bytes for p in below])
    keep = bm <= cap
    assert len(st_) == int(keep.sum()), (len(st_), int(keep.sum()))
    np.testing.assert_allclose(st_, bt[keep], rtol=1e-9)
    np.testing.assert_allclose(sm, bm[keep], rtol=1e-9)


def test_default_settings_refine_a_heavy_head_beyond_the_fixed_slack():
    # 4 small layers and a 32K-vocabulary head on two ranks: the split (3, 1) is 24% faster than
    # the even (2, 2) at the same memory and on the brute-force frontier. REFINE_SLACK's 10% alone
    # dropped it (a hypothesis case); the refinement test's balanced-rank bound keeps it.
    model = ModelSpec(name="heavy-head", num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=4,
                      ffn_hidden_size=1024, gated_mlp=False, vocab_size=32000, moe_num_experts=4, moe_top_k=2)
    cluster = cluster_for_gpu("a100-40gb", gpus_per_node=2).with_gpus(2)
    training = TrainingSpec(seq_len=2048, global_batch=8)
    bt, bm, _ = brute_force(model, cluster, training, OPTIONS)
    res = search(model, cluster, training, options=OPTIONS)
    cap = max(res.budget_bytes, cluster.gpu.memory_bytes)
    searched = np.array([p.step_time_s for p in res.frontier])
    missing = [t for t in bt[bm <= cap] if not np.any(np.isclose(searched, t, rtol=1e-9))]
    assert not missing, missing  # the (3, 1) mb4 split at 0.0292 s


@settings(max_examples=8, deadline=None)
@given(small_cases(), st.integers(0, 1))
def test_balanced_bound_is_below_every_split(case, mtp):
    # The refinement test and the pruning read search.even.balanced_slice: its step time must be
    # at most that of every layer split of its configuration (the policy on every layer), and
    # its memory at most the even split's (the proof is in its docstring; this checks it against
    # the cost model; with multi-token-prediction modules it is the even split's bound only).
    model, cluster, training = case
    model = replace(model, mtp_num_layers=mtp)
    space = enumerate_space(model, training, cluster.num_gpus, OPTIONS)
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    layer = shared_layer_cost(ctx, space).take(slice(None))
    stack = shared_layer_cost(ctx, space).take_stack(slice(None))
    bound, even = balanced_slice(ctx, space, layer, stack), even_slice(ctx, space, layer, stack=stack)
    tol = 1 + 1e-12
    assert np.all(bound.step_time_s <= even.step_time_s * tol)
    assert np.all(bound.peak_memory_bytes <= even.peak_memory_bytes * tol)
    one = space.pp == 1
    np.testing.assert_array_equal(bound.step_time_s[one], even.step_time_s[one])
    if needs_rank_mix(model):
        return  # ranks of their own kinds (MTP modules): the first rank, a bound of the even split only
    for i in np.flatnonzero(~one):
        pp, vpp = int(space.pp[i]), int(space.vpp[i])
        none = RECOMPUTES[int(space.recompute[i])] == Recompute.NONE
        for n in compositions(model.num_layers, pp, vpp):
            layers, rec = chunk_split(np.array(n), np.zeros(pp, int) if none else np.array(n), vpp)
            est = estimate(model, cluster, training, space.plan(i, layers, rec))
            assert est.step_time_s * tol >= bound.step_time_s[i], (space.plan(i, layers, rec), est.step_time_s)


def _missing_below_cap(**limits):
    model, cluster, training = _seed_case()
    bt, bm, _ = brute_force(model, cluster, training, OPTIONS)
    res = search(model, cluster, training, options=OPTIONS, **limits)
    cap = max(res.budget_bytes, cluster.gpu.memory_bytes)
    ft = np.array([p.step_time_s for p in res.frontier])
    fm = np.array([p.peak_memory_bytes for p in res.frontier])
    missing = [(t, m) for t, m in zip(bt, bm) if m <= cap
               and not np.any(np.isclose(ft, t, rtol=1e-9) & np.isclose(fm, m, rtol=1e-9))]
    return missing, ft, fm


def test_seed_case_interleaved_recompute_point_is_found():
    missing, _, _ = _missing_below_cap(refine_slack=float("inf"), memory_cap_bytes=float("inf"),
                                      stage_points=10_000)
    assert not missing, missing


def test_seed_case_default_limits_find_the_point():
    # The point the folded walk missed (0.0139416 s, 10.033 GiB: pp2 vpp2 mb1 full recompute,
    # rank 0 recomputing both its layers; r (2, 1) tied with it on the folded time, 8.8e-5 s
    # slower) is found with the default work limits too (search.stage_tails).
    missing, ft, fm = _missing_below_cap()
    assert not missing, missing
    near = np.isclose(ft, 0.0139416, rtol=1e-5) & np.isclose(fm / 2**30, 10.0326, rtol=1e-4)
    assert near.sum() == 1
