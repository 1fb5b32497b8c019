"""Expert load: the busiest ep rank under placements, replicas and capacity (cost/expert_load.py),
golden values worked by hand and properties; the log reader; the load in the estimate and search."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import estimate
from meshplan.cost.expert_load import (balanced, contiguous, greedy, kept_shares, load_stats, with_replicas)
from meshplan.errors import MeshplanError
from meshplan.plan import ExpertPlacement, Job, ParallelDims, Plan
from meshplan.search.planner import search
from meshplan.search.space import SearchOptions
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.expert_load import ExpertLoad, read_expert_load, zipf_load
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

COUNTS = [40, 10, 10, 10, 10, 10, 5, 5]
"""8 experts, 100 routed copies: the hand-worked example."""


def _log(counts) -> ExpertLoad:
    return ExpertLoad(counts=((tuple(counts),),), source="hand")


def test_contiguous_golden():
    # ep 4: ranks hold {0,1} 50, {2,3} 20, {4,5} 20, {6,7} 10 of 100 copies; the mean rank 25
    shares = np.array(COUNTS) / 100
    assert contiguous(8, 4).rank_loads(shares) * 100 == pytest.approx([50, 20, 20, 10])
    st_ = load_stats(_log(COUNTS), 8, 4, balanced_placement=False, replicas=0, capacity_factor=None)
    assert st_.load_factor == pytest.approx(50 / 25)
    assert st_.imbalance == pytest.approx(40 / 12.5)
    assert st_.dropped_fraction == 0.0


def test_greedy_golden():
    # hottest first onto the least loaded rank with a free slot (2 per rank): 40 -> r0; 10s -> r1,
    # r2, r3, r1, r2; 5 -> r3; the last 5 finds only r0 open: loads 45, 20, 20, 15
    shares = np.array(COUNTS) / 100
    assert greedy(shares, 4).rank_loads(shares) * 100 == pytest.approx([45, 20, 20, 15])
    st_ = load_stats(_log(COUNTS), 8, 4, balanced_placement=True, replicas=0, capacity_factor=None)
    assert st_.load_factor == pytest.approx(45 / 25)


def test_replicas_golden():
    # one replica slot per rank: expert 0 (40) gets a copy on r3 (loads 25, 20, 20, 35), then r1
    # (40/3 each: 18.3, 33.3, 20, 28.3), then r2 (10 each: 15, 30, 30, 25); the busiest rank r1's
    # hottest copy is then expert 0's, which every rank already holds: stop at 30
    shares = np.array(COUNTS) / 100
    place = with_replicas(greedy(shares, 4), shares, 1)
    assert place.copies.sum(axis=0)[0] == 4
    assert place.rank_loads(shares) * 100 == pytest.approx([15, 30, 30, 25])
    st_ = load_stats(_log(COUNTS), 8, 4, balanced_placement=True, replicas=1, capacity_factor=None)
    assert st_.load_factor == pytest.approx(30 / 25)


def test_capacity_golden():
    # capacity 1.25 x the mean expert (12.5 copies): expert 0 keeps 15.625 of 40, 24.375 dropped;
    # contiguous rank 0 then holds 15.625 + 10 = 25.625 against the dropless mean 25
    st_ = load_stats(_log(COUNTS), 8, 4, balanced_placement=False, replicas=0, capacity_factor=1.25)
    assert st_.dropped_fraction == pytest.approx(0.24375)
    assert st_.load_factor == pytest.approx(25.625 / 25)


def test_zipf_shares():
    s = zipf_load(1.0).shares(4)[0, 0]
    h = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert s == pytest.approx([1 / h, 1 / 2 / h, 1 / 3 / h, 1 / 4 / h])
    assert zipf_load(0).shares(8)[0, 0] == pytest.approx(np.full(8, 1 / 8))


counts_st = st.lists(st.integers(0, 1000), min_size=8, max_size=8).filter(lambda c: sum(c) > 0)


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, ep=st.sampled_from([1, 2, 4, 8]), replicas=st.integers(0, 2),
       cf=st.one_of(st.none(), st.floats(0.5, 4.0)))
def test_balanced_never_worse_than_contiguous_and_bounds(counts, ep, replicas, cf):
    shares = np.array(counts, dtype=float) / sum(counts)
    worst = contiguous(8, ep).rank_loads(shares).max()
    best = balanced(shares, ep).rank_loads(shares).max()
    assert best <= worst + 1e-12
    if replicas <= 8 // ep:
        more = with_replicas(balanced(shares, ep), shares, replicas).rank_loads(shares).max()
        assert more <= best + 1e-12
    kept = kept_shares(shares, cf)
    st_ = load_stats(_log(counts), 8, ep, balanced_placement=True, replicas=0, capacity_factor=cf)
    assert 0.0 <= st_.dropped_fraction < 1.0
    assert st_.dropped_fraction == pytest.approx(1.0 - kept.sum())
    if replicas <= 8 // ep:  # replicas never raise the busiest rank, with or without drops
        st_r = load_stats(_log(counts), 8, ep, balanced_placement=True, replicas=replicas, capacity_factor=cf)
        assert st_r.load_factor <= st_.load_factor + 1e-12
    if cf is None:
        assert st_.load_factor >= 1.0 - 1e-12  # the busiest rank holds at least the mean
    else:
        assert st_.load_factor <= cf * 1.0 + 1e-9  # capacity caps every expert, so every rank


MOE = model_preset("qwen3-30b-a3b")
CLUSTER = resolve_cluster(None, gpu="h100-sxm", nodes=2)
PLAN = Plan(dims=ParallelDims(dp_shard=16, ep=8), zero=1)


@settings(max_examples=15, deadline=None)
@given(s1=st.floats(0.0, 2.0), ds=st.floats(0.0, 1.0))
def test_more_skew_is_never_faster_at_a_fixed_plan(s1, ds):
    def step(s):
        tr = TrainingSpec(seq_len=4096, global_batch=64, expert_load=zipf_load(s))
        return estimate(MOE, CLUSTER, tr, PLAN).step_time_s

    assert step(s1 + ds) >= step(s1) * (1 - 1e-12)


@settings(max_examples=15, deadline=None)
@given(s=st.floats(0.0, 2.5), ep=st.sampled_from([2, 4, 8, 16]), cf=st.one_of(st.none(), st.floats(1.0, 3.0)))
def test_balanced_placement_is_never_slower_than_contiguous(s, ep, cf):
    tr = TrainingSpec(seq_len=4096, global_batch=64, expert_load=zipf_load(s), moe_capacity_factor=cf)
    plan = Plan(dims=ParallelDims(dp_shard=16, ep=ep), zero=1)
    worse = estimate(MOE, CLUSTER, tr, plan)
    better = estimate(MOE, CLUSTER, tr, replace(plan, expert_placement=ExpertPlacement.BALANCED))
    assert better.step_time_s <= worse.step_time_s * (1 + 1e-12)
    assert better.peak_memory_gib == pytest.approx(worse.peak_memory_gib)


def test_estimate_changes_with_skew_and_placement_pays():
    base = TrainingSpec(seq_len=4096, global_batch=64)
    skewed = replace(base, expert_load=zipf_load(1.2))
    plain = estimate(MOE, CLUSTER, base, PLAN)
    uniform = estimate(MOE, CLUSTER, replace(base, expert_load=zipf_load(0.0)), PLAN)
    hot = estimate(MOE, CLUSTER, skewed, PLAN)
    bal = estimate(MOE, CLUSTER, skewed, replace(PLAN, expert_placement=ExpertPlacement.BALANCED))
    rep = estimate(MOE, CLUSTER, skewed, replace(PLAN, expert_placement=ExpertPlacement.BALANCED, expert_replicas=1))
    assert uniform.step_time_s == pytest.approx(plain.step_time_s)  # the default calibration is balanced
    assert hot.step_time_s > bal.step_time_s > rep.step_time_s
    assert hot.expert_load.load_factor > bal.expert_load.load_factor > rep.expert_load.load_factor >= 1.0
    assert rep.peak_memory_gib > bal.peak_memory_gib == pytest.approx(hot.peak_memory_gib)  # replicas cost memory
    assert rep.time.dp_comm_total_s > bal.time.dp_comm_total_s  # and a gradient all-reduce


def test_search_places_experts_where_it_pays():
    # on one 8-GPU node the fastest plans keep experts whole (ep 1); among expert-parallel ones
    # (a restriction, like a target's), a skewed load makes the balanced placement win
    cluster = resolve_cluster(None, gpu="h100-sxm", nodes=1)
    tr = TrainingSpec(seq_len=4096, global_batch=16, expert_load=zipf_load(1.5))
    expert_parallel = lambda space: space.ep > 1  # noqa: E731
    on = search(MOE, cluster, tr, options=SearchOptions(allow=expert_parallel))
    off = search(MOE, cluster, tr, options=SearchOptions(allow=expert_parallel, expert_placement=False))
    assert min(p.step_time_s for p in on.frontier) < min(p.step_time_s for p in off.frontier)
    best = min(on.frontier, key=lambda p: p.step_time_s).plan
    assert best.expert_placement == ExpertPlacement.BALANCED
    assert all(p.plan.expert_placement == ExpertPlacement.CONTIGUOUS and not p.plan.expert_replicas
               for p in off.frontier)
    uniform = search(MOE, cluster, replace(tr, expert_load=None), options=SearchOptions(allow=expert_parallel))
    assert all(p.plan.expert_placement == ExpertPlacement.CONTIGUOUS for p in uniform.frontier)


def test_job_json_carries_the_expert_load(tmp_path):
    job = Job(model=MOE, training=TrainingSpec(seq_len=4096, global_batch=64, expert_load=_log(COUNTS)),
              cluster=CLUSTER, plan=replace(PLAN, expert_placement=ExpertPlacement.BALANCED, expert_replicas=1))
    path = tmp_path / "job.json"
    job.save(path)
    back = Job.load(path)
    assert back.training.expert_load == job.training.expert_load
    assert back.plan == job.plan and "ep8balr1" in back.plan.notation()
    plain = Job(model=MOE, training=TrainingSpec(seq_len=4096, global_batch=64), cluster=CLUSTER, plan=PLAN)
    plain.save(path)
    assert Job.load(path).training.expert_load is None


def test_mismatched_and_misplaced_loads_are_refused():
    with pytest.raises(MeshplanError, match="counts 8 experts, the model has 128"):
        estimate(MOE, CLUSTER, TrainingSpec(seq_len=4096, global_batch=64, expert_load=_log(COUNTS)), PLAN)
    with pytest.raises(MeshplanError, match="has no experts"):
        estimate(model_preset("llama3-8b"), CLUSTER,
                 TrainingSpec(seq_len=4096, global_batch=64, expert_load=zipf_load(1.0)), Plan(dims=ParallelDims(dp_replicate=16)))
    with pytest.raises(MeshplanError, match="need ep > 1"):
        Plan(expert_placement=ExpertPlacement.BALANCED)
    with pytest.raises(MeshplanError, match="Zipf exponent"):
        zipf_load(-1.0)


@pytest.mark.parametrize("text, fragment", [
    ("", "empty expert-load log"),
    ("not json\n", "line 1: not JSON"),
    ('{"format": "other"}\n', "not an expert-load log"),
    ('{"format": "meshplan-expert-load", "version": 9, "num_experts": 2, "moe_layers": 1}\n', "version 9"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 0, "moe_layers": 1}\n', "num_experts"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 2, "moe_layers": 1}\n', "no step lines"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 2, "moe_layers": 1}\n{"step": 1, "counts": [[1, 2, 3]]}\n',
     "line 2: \"counts\" must be 1 lists of 2"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 2, "moe_layers": 1}\n{"step": 1, "counts": [[1, -2]]}\n',
     "line 2: token counts must be non-negative integers, got -2"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 2, "moe_layers": 1}\n{"step": 1, "counts": [[0, 0]]}\n',
     "routed no token"),
    ('{"format": "meshplan-expert-load", "version": 1, "num_experts": 2, "moe_layers": 1}\n{"step": 1, "counts": [[1.5, 2]]}\n',
     "non-negative integers, got 1.5"),
])
def test_bad_logs_are_one_line(tmp_path, text, fragment):
    p = tmp_path / "log.jsonl"
    p.write_text(text)
    with pytest.raises(MeshplanError) as exc:
        read_expert_load(p)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
