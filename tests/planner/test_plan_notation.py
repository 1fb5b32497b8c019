"""A plan's notation and its flags: typed back, they give the same plan; two plans never share a
notation (issue 12, item 9)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meshplan.cli.plan_flags import PlanFlags, build_plan, flags_for, plan_argv
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, OpGroup, ParallelDims, Plan, Recompute, Schedule, format_counts, parse_counts


def test_readme_plan_by_hand():
    """A hybrid-sharded interleaved plan with a ragged split (an earlier README recommendation):
    dp 32 = 16 replicas x 2 ZeRO-2 shards. The README's current one: tests/cli/test_plan_flags_cli.py."""
    split = (2,) * 8 + (1,) + (2,) * 6 + (1,) * 6 + (2,) * 2 + (1,) * 41
    p = Plan(dims=ParallelDims(dp_replicate=16, dp_shard=2, tp=2, pp=8, cp=2), zero=2, sp=True,
             schedule=Schedule.INTERLEAVED_1F1B, vpp=8, stage_layers=split)
    assert sum(split) == 80 and len(split) == 64
    assert p.notation() == "dp32 zero2x2 tp2sp pp8(interleaved-1f1b,v8) cp2 mb1 layers=2x8,1,2x6,1x6,2x2,1x41"
    assert plan_argv(p) == "--dp 32 --dp-shard 2 --tp 2 --pp 8 --cp 2 --zero 2 --vpp 8 --stage-layers 2x8,1,2x6,1x6,2x2,1x41"
    even = Plan(dims=ParallelDims(dp_replicate=16, dp_shard=2, tp=2, pp=8, cp=2), zero=2, sp=True,
                schedule=Schedule.INTERLEAVED_1F1B, vpp=8, stage_layers=(2,) * 16 + (1,) * 48)
    assert "layers=" not in even.notation()  # the even split is the default: not shown


def test_notation_by_hand():
    fsdp = Plan(dims=ParallelDims(dp_shard=8), zero=3)
    assert fsdp.notation() == "dp8 fsdp8 tp1 pp1 cp1 mb1" and plan_argv(fsdp) == "--dp 8 --zero 3"
    ddp = Plan(dims=ParallelDims(dp_replicate=4, tp=2), sp=False, micro_batch=2)
    assert ddp.notation() == "dp4 tp2 pp1 cp1 mb2" and plan_argv(ddp) == "--dp 4 --tp 2 --micro-batch 2 --no-sp"
    part = Plan(dims=ParallelDims(pp=2), recompute=Recompute.FULL, stage_layers=(3, 3), recompute_layers=(2, 0))
    assert part.notation() == "dp1 tp1 pp2(1f1b) cp1 mb1 ckpt=full:2,0"
    assert plan_argv(part) == "--dp 1 --pp 2 --recompute full --recompute-layers 2,0"
    allrec = Plan(dims=ParallelDims(pp=2), recompute=Recompute.SELECTIVE, stage_layers=(2, 4), recompute_layers=(2, 4))
    assert allrec.notation() == "dp1 tp1 pp2(1f1b) cp1 mb1 layers=2,4 ckpt=sel:all"


@given(st.lists(st.integers(0, 12), min_size=1, max_size=70))
def test_counts_round_trip(counts):
    text = format_counts(tuple(counts))
    assert parse_counts(text, "--stage-layers") == tuple(counts)
    assert " " not in text  # one shell word


@pytest.mark.parametrize("text", ["", "1,,2", "2x", "x3", "2x0", "-1", "1.5", "2x3x4"])
def test_bad_counts_are_one_clear_error(text):
    with pytest.raises(MeshplanError, match="--stage-layers"):
        parse_counts(text, "--stage-layers")


def _split(draw, layers: int, stages: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=stages - 1, max_size=stages - 1)))
    bounds = [0, *cuts, layers]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def plans(draw):
    """Any valid plan: degrees, ZeRO, schedules, virtual stages, uneven splits, partial recompute,
    OSDP's kept groups and splits."""
    dp_r, dp_s, tp, pp, cp = (draw(st.sampled_from([1, 2, 3, 4, 8])) for _ in range(5))
    zero = draw(st.integers(0, 3)) if dp_s == 1 else draw(st.integers(1, 3))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if (dp_s * cp) % e == 0]))
    vpp = draw(st.integers(1, 3)) if pp > 1 else 1
    schedule = draw(st.sampled_from([s for s in Schedule if vpp == 1 or s.supports_virtual_stages]))
    stages = pp * vpp
    layers = draw(st.integers(stages + 1, stages + 24))
    split = draw(st.sampled_from(["none", "drawn"]))
    stage_layers = _split(draw, layers, stages) if split == "drawn" else ()
    recompute = draw(st.sampled_from(list(Recompute)))
    rec_layers: tuple[int, ...] = ()
    if recompute != Recompute.NONE and stage_layers and draw(st.booleans()):
        rec_layers = tuple(draw(st.integers(0, n)) for n in stage_layers)
    try:
        plan = Plan(dims=ParallelDims(dp_replicate=dp_r, dp_shard=dp_s, tp=tp, pp=pp, cp=cp, ep=ep), zero=zero,
                    sp=draw(st.booleans()) if tp > 1 else False, schedule=schedule, vpp=vpp,
                    stage_layers=stage_layers, cp_method=draw(st.sampled_from(list(CPMethod))),
                    micro_batch=draw(st.integers(1, 4)), recompute=recompute, recompute_layers=rec_layers,
                    # OSDP (zero 3 only for the keeps and the MLP slices)
                    keep_gathered=tuple(draw(st.sets(st.sampled_from(list(OpGroup))))) if zero == 3 else (),
                    mlp_splits=draw(st.sampled_from([1, 2, 4])) if zero == 3 else 1,
                    head_splits=draw(st.sampled_from([1, 2, 8])))
    except MeshplanError:
        assume(False)
    return plan, SimpleNamespace(num_layers=layers)  # with_defaults reads num_layers only


@settings(max_examples=300, deadline=None)
@given(plans())
def test_flags_rebuild_the_plan(drawn):
    """plan -> flags -> build_plan gives the same plan (once both have their defaults)."""
    plan, model = drawn
    rebuilt = build_plan(plan.dims.world_size, flags_for(plan))
    assert rebuilt.with_defaults(model) == plan.with_defaults(model)
    assert rebuilt.notation() == plan.notation()


def test_every_plan_of_a_small_space_prints_differently():
    """All plans of 8 GPUs and 6 layers (every split, every recompute count): notation is one-to-one."""
    seen: dict[str, Plan] = {}
    model = SimpleNamespace(num_layers=6)
    degrees = [d for d in itertools.product([1, 2, 4, 8], repeat=4) if d[0] * d[1] * d[2] * d[3] == 8]
    for (dp_r, dp_s, tp, pp), zero, vpp, sched, rec in itertools.product(
            degrees, range(4), (1, 2), list(Schedule), list(Recompute)):
        stages = pp * vpp
        if stages > 6 or (dp_s > 1 and zero == 0) or (vpp > 1 and (pp == 1 or not sched.supports_virtual_stages)):
            continue
        for cuts in itertools.combinations(range(1, 6), stages - 1):
            bounds = [0, *cuts, 6]
            split = tuple(b - a for a, b in zip(bounds, bounds[1:]))
            recs = [()] if rec == Recompute.NONE else itertools.product(*(range(n + 1) for n in split))
            for rec_layers in recs:
                plan = Plan(dims=ParallelDims(dp_replicate=dp_r, dp_shard=dp_s, tp=tp, pp=pp), zero=zero,
                            sp=tp > 1, schedule=sched, vpp=vpp, stage_layers=split, recompute=rec,
                            recompute_layers=rec_layers).with_defaults(model)
                other = seen.setdefault(plan.notation(), plan)
                assert other == plan, plan.notation()
    assert len(seen) > 1000


def test_flags_through_the_option_names():
    """argv names are the real options of `meshplan estimate` (PlanFlags field -> --flag)."""
    p = Plan(dims=ParallelDims(dp_replicate=2, dp_shard=2, tp=2, pp=2, cp=2, ep=2), zero=1, sp=False,
             schedule=Schedule.ZERO_BUBBLE, vpp=2, cp_method=CPMethod.ALL_TO_ALL, micro_batch=2,
             recompute=Recompute.SELECTIVE, stage_layers=(1, 2, 2, 3), recompute_layers=(1, 0, 2, 3))
    argv = flags_for(p).argv()
    assert argv == ["--dp", "4", "--dp-shard", "2", "--tp", "2", "--pp", "2", "--cp", "2", "--ep", "2",
                    "--zero", "1", "--micro-batch", "2", "--recompute", "selective", "--schedule", "zero-bubble",
                    "--vpp", "2", "--no-sp", "--cp-method", "all-to-all", "--stage-layers", "1,2x2,3",
                    "--recompute-layers", "1,0,2,3"]
    assert PlanFlags().argv() == [] and PlanFlags(dp=1).argv() == ["--dp", "1"]
