"""The enumerated space: every legal global configuration, nothing illegal, no duplicates."""

import itertools
from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost.arrays import PlanArrays
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute, Schedule
from meshplan.search.space import SearchOptions, divisors, enumerate_space, factorisations
from meshplan.search.space_membership import canonical, in_space
from meshplan.spec.model import ModelSpec
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def test_factorisations_count_and_product():
    f = factorisations(12, 5)
    brute = [t for t in itertools.product(divisors(12), repeat=5) if np.prod(t) == 12]
    assert sorted(map(tuple, f.tolist())) == sorted(brute)
    assert len(factorisations(2**14, 5)) == 3060  # C(14 + 4, 4)


def test_every_row_is_a_valid_plan_and_rows_are_distinct():
    model = model_preset("llama2-7b")
    training = TrainingSpec(seq_len=2048, global_batch=64)
    space = enumerate_space(model, training, 8)
    rows = {tuple(int(getattr(space, f.name)[i]) for f in fields(PlanArrays)) for i in range(len(space))}
    assert len(rows) == len(space)
    for i in np.random.default_rng(0).choice(len(space), 200, replace=False):
        space.plan(int(i)).validate_for(model, training, 8)  # raises if illegal


@st.composite
def cases(draw):
    heads = draw(st.sampled_from([4, 6, 8]))
    model = ModelSpec(name="m", num_layers=draw(st.integers(1, 5)), hidden_size=heads * 16,
                      num_heads=heads, num_kv_heads=draw(st.sampled_from([heads, 2, 1])), vocab_size=1000)
    training = TrainingSpec(seq_len=draw(st.sampled_from([6, 8, 12, 64])),
                            global_batch=draw(st.sampled_from([1, 2, 3, 4, 6])))
    gpus = draw(st.sampled_from([1, 2, 3, 4, 6]))
    return model, training, gpus


def _all_plans(gpus, batch):
    """Every Plan object the Plan contract accepts for this GPU count (small cases)."""
    for pp, r, s, cp, tp in factorisations(gpus, 5).tolist():
        for zero, sp, cpm, (sched, vpp), mb, rec in itertools.product(
                range(4), (False, True), tuple(CPMethod),
                [(s_, 1) for s_ in Schedule] + [(Schedule.INTERLEAVED_1F1B, 2), (Schedule.ZERO_BUBBLE, 2)],
                divisors(batch), tuple(Recompute)):
            try:
                yield Plan(dims=ParallelDims(pp=pp, dp_replicate=r, dp_shard=s, cp=cp, tp=tp), zero=zero,
                           sp=sp, cp_method=cpm, schedule=sched, vpp=vpp, micro_batch=mb, recompute=rec)
            except MeshplanError:
                continue


@settings(max_examples=10, deadline=None)
@given(cases())
def test_space_is_exactly_the_legal_canonical_plans(case):
    model, training, gpus = case
    opts = SearchOptions(max_vpp=2)
    space = enumerate_space(model, training, gpus, opts)
    listed = {space.plan(i) for i in range(len(space))}
    legal = set()
    for plan in _all_plans(gpus, training.global_batch):
        if plan.schedule == Schedule.ZERO_BUBBLE:
            continue  # not searched by default (SearchOptions.schedules)
        try:
            plan.validate_for(model, training, gpus)
        except MeshplanError:
            assert not in_space(model, training, gpus, plan, opts)
            continue
        legal.add(canonical(plan))
        assert in_space(model, training, gpus, canonical(plan), opts)
    assert listed == legal


def test_rules_prune_illegal_degrees():
    model = model_preset("llama3-70b")  # 64 heads, 8 KV heads, 80 layers
    training = TrainingSpec(seq_len=8192, global_batch=1024)
    s = enumerate_space(model, training, 1024)
    assert np.all(64 % s.tp == 0) and np.all(s.pp <= 80)
    assert np.all(1024 % (s.dp_replicate * s.dp_shard * s.micro_batch) == 0)
    assert np.all(s.zero[s.dp_shard > 1] > 0)
    # ZeRO shards over dp_shard x cp: over cp alone every stage is a plan; over one rank only 0
    assert np.all(s.zero[(s.dp_shard == 1) & (s.cp == 1)] == 0)
    assert set(s.zero[(s.dp_shard == 1) & (s.cp > 1)]) == {0, 1, 2, 3}
    assert np.all(s.etp == s.tp)  # dense: no expert tensor parallel of its own
    # vpp beyond MAX_VPP only where the chunks split the 80 layers (+ embedding + loss) evenly
    big = (s.pp > 1) & (s.vpp > 8)
    chunks = s.pp[big] * s.vpp[big]
    assert big.any() and np.all((80 % chunks == 0) | (82 % chunks == 0))
    assert {(2, 10), (2, 20), (2, 40), (4, 10), (4, 20), (8, 10)} <= set(zip(s.pp[big], s.vpp[big]))
    assert not np.any(s.sp & (s.tp == 1))
    with pytest.raises(MeshplanError):
        enumerate_space(model, training, 0)


def test_published_vpp_beyond_eight_is_searched():
    """Qwen3-235B-A22B's recipe runs 94 layers as pp 4 x vpp 12 (96 = 94 + embedding + loss
    slots in 48 chunks); a 94-layer stack keeps that chunk count in the space."""
    from meshplan.spec.model import scaled

    model = scaled(model_preset("llama3-8b"), num_layers=94)
    s = enumerate_space(model, TrainingSpec(seq_len=4096, global_batch=64), 64, SearchOptions(recomputes=(Recompute.NONE,)))
    pairs = set(zip(s.pp[s.pp > 1].tolist(), s.vpp[s.pp > 1].tolist()))
    assert (4, 12) in pairs and (2, 47) in pairs and (4, 11) not in pairs


@pytest.mark.parametrize("target", ["meshplan", "megatron"])
def test_cross_groups_in_blocks_is_the_whole_crossing(monkeypatch, target):
    # With an allow mask, a large space is crossed and filtered block by block of groups
    # (space._cross_allowed_in_blocks): the same rows, columns and order as crossing it whole
    # and filtering once, module-set rows (appended after every group's plain rows) included.
    from meshplan.search import space
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec
    from meshplan.targets import search_options

    model, training = model_preset("qwen3-30b-a3b"), TrainingSpec(seq_len=4096, global_batch=64)
    options = search_options(target, model, training)
    if options.allow is None:  # the target's own mask, or a row-wise one that keeps module-set rows
        options = replace(options, allow=lambda c: (c.micro_batch <= 2) | (c.pp > 1))
    groups = space.enumerate_groups(model, training, 16, options)
    whole = space._cross_whole(groups, model, training, options, None)
    monkeypatch.setattr(space, "CROSS_BLOCK_ROWS", max(1, len(whole) // 7))
    blocks = space.cross_groups(groups, model, training, options)
    if target == "megatron":
        assert np.count_nonzero(np.asarray(whole.recompute_modules)) > 0  # the appended rows are there
    for f in fields(PlanArrays):
        a, b = getattr(blocks, f.name), getattr(whole, f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
