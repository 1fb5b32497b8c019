"""The embedding / loss layouts (Megatron's --account-for-embedding/loss-in-pipeline-split with
num_layers + 2 virtual stages) and Megatron-Core's recompute module sets in the Megatron target's
space: hand-checked stage assignments, the search's scores against ``estimate``, the frontier
of the Llama 3.1 405B recipe's job, and the published plans now inside the space."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from meshplan.calib.hardware import resolve_hardware
from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.plan import ParallelDims, Plan, Recompute, RecomputeModule, Schedule, embedding_loss_split
from meshplan.search.embedding_chunks import embedding_loss_layers, embedding_loss_plan, score_embedding_loss
from meshplan.search.frontier import pareto_indices
from meshplan.search.planner import search
from meshplan.search.space import (SearchOptions, cost_module_code, embedding_loss_space, embedding_loss_vpp,
                                   enumerate_groups)
from meshplan.search.space_membership import in_space, why_outside
from meshplan.search.tables import CostContext
from meshplan.spec.cluster import GIB, cluster_for_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec
from meshplan.targets import search_options, why_not

LLAMA405 = model_preset("llama3.1-405b")  # 126 layers
JOB405 = TrainingSpec(seq_len=8192, global_batch=1536, precision=Precision.FP8)
PUBLISHED405 = Plan(dims=ParallelDims(dp_shard=4, tp=4, pp=16), zero=1, sp=True, schedule=Schedule.INTERLEAVED_1F1B,
                    vpp=8, micro_batch=1, stage_layers=(0,) + (1,) * 126 + (0,))
"""Megatron-Bridge rows 322/360/... (Llama 3.1 405B, 256 GB200, tp4 pp16 vpp8, 126 layers + E + L)."""


# ---- golden layouts, checked by hand ---------------------------------------------------------
def test_405b_recipe_layout():
    # 128 slots over 16 x 8 virtual stages, one each: stage 0 = E, stage 127 = L, stage s on rank s % 16.
    # Rank 0 holds stages 0, 16, ..., 112: the embedding and 7 layers; rank 15 stages 15, ..., 127:
    # 7 layers and the loss; ranks 1-14 eight layers each.
    stages, ranks = embedding_loss_layers(126, 16, 8)
    assert stages == (0,) + (1,) * 126 + (0,)
    assert ranks == (7,) + (8,) * 14 + (7,)
    assert sum(ranks) == 126


def test_small_layouts():
    # 6 layers + E + L = 8 slots. pp2 x v4: rank 0 holds stages 0,2,4,6 = E,t,t,t (3 layers), rank 1
    # stages 1,3,5,7 = t,t,t,L (3 layers).
    assert embedding_loss_layers(6, 2, 4) == ((0, 1, 1, 1, 1, 1, 1, 0), (3, 3))
    # pp4 x v2: rank 0 stages 0,4 = E,t; rank 1 stages 1,5 = t,t; rank 2 2,6 = t,t; rank 3 3,7 = t,L.
    assert embedding_loss_layers(6, 4, 2) == ((0, 1, 1, 1, 1, 1, 1, 0), (1, 2, 2, 1))
    # two slots per stage (10 layers + 2 = 12 over pp2 x v3): E+t, then t+t, and t+L last
    assert embedding_loss_layers(10, 2, 3) == ((1, 2, 2, 2, 2, 1), (5, 5))


def test_which_pipeline_degrees_get_the_layout():
    opts = SearchOptions(embedding_loss_chunks=True)
    pp = np.array([1, 2, 4, 8, 16, 32, 64, 128, 3])
    # 128 slots: pp divides 128, at least two chunks per rank, more chunks (128) than the 126 layers
    assert embedding_loss_vpp(LLAMA405, pp, opts).tolist() == [0, 64, 32, 16, 8, 4, 2, 0, 0]
    assert embedding_loss_vpp(LLAMA405, pp, SearchOptions()).tolist() == [0] * 9  # off by default
    assert embedding_loss_vpp(LLAMA405, pp, replace(opts, max_vpp=8)).tolist() == [0, 0, 0, 0, 8, 4, 2, 0, 0]
    # DeepSeek-V3's 61 layers + 2 = 63 = 7 x 9, but its ranks are charged their own dense / MTP layers
    assert embedding_loss_vpp(model_preset("deepseek-v3"), np.array([7, 9]), opts).tolist() == [0, 0]
    no_interleaving = replace(opts, schedules=(Schedule.ONE_F_ONE_B,))
    assert embedding_loss_vpp(LLAMA405, pp, no_interleaving).tolist() == [0] * 9


# ---- the search's scores are estimate's ---------------------------------------------------------
@st.composite
def small_jobs(draw):
    heads = draw(st.sampled_from([4, 8]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    model = ModelSpec(
        name="rand", num_layers=draw(st.sampled_from([2, 4, 6, 10])), hidden_size=hidden, num_heads=heads,
        num_kv_heads=heads, ffn_hidden_size=4 * hidden, gated_mlp=draw(st.booleans()),
        vocab_size=draw(st.sampled_from([8000, 32000])),
        **(dict(moe_num_experts=4, moe_top_k=2) if draw(st.integers(0, 3)) == 0 else {}))
    cluster = cluster_for_gpu(draw(st.sampled_from(["h100-sxm", "a100-40gb"])), gpus_per_node=4).with_gpus(
        draw(st.sampled_from([2, 4, 8])))
    training = TrainingSpec(seq_len=draw(st.sampled_from([512, 2048])), global_batch=draw(st.sampled_from([8, 16])))
    return model, cluster, training, draw(st.booleans())


OPTIONS = SearchOptions(embedding_loss_chunks=True, offloads=(), vocab_parallel=False, osdp=False)


@settings(max_examples=10, deadline=None)
@given(small_jobs())
def test_scores_are_estimates(case):
    """Every configuration of the pass, scored on ranks 0, 1 and p-1, equals ``estimate`` of its plan
    (every rank, the layout's chunk weights), with and without preallocated receive buffers (where
    a middle rank can hold the most); rank 1 alone (the pass's bound) is below every row."""
    model, cluster, training, prealloc = case
    calib = calibration_for(cluster.gpu).replace_fields(pp_preallocated_recv_buffers=prealloc)
    ctx = CostContext(model, cluster, training, calib)
    space = embedding_loss_space(enumerate_groups(model, training, cluster.num_gpus, OPTIONS), model, training, OPTIONS)
    if space is None:
        return
    got = score_embedding_loss(ctx, space)
    bound = score_embedding_loss(ctx, space, bound_only=True)  # what the search prunes these rows on
    assert np.all(bound.step_time_s <= got.step_time_s) and np.all(bound.peak_memory_bytes <= got.peak_memory_bytes)
    for i in range(0, len(space), max(1, len(space) // 40)):  # about 40 rows each (estimate is per plan)
        plan = embedding_loss_plan(ctx, space, i)
        assert plan.dims.pp * plan.vpp == model.num_layers + 2
        est = estimate(model, cluster, training, plan, calib)
        assert got.step_time_s[i] == pytest.approx(est.step_time_s, rel=1e-9)
        assert got.peak_memory_bytes[i] == pytest.approx(est.fit_memory_gib * GIB, rel=1e-9)


@settings(max_examples=6, deadline=None)
@given(small_jobs())
def test_frontier_is_the_union_frontier(case):
    """With the layouts on, the frontier is the Pareto set of the frontier without them and every
    layout's estimate (the pass adds points, it drops none)."""
    model, cluster, training, _ = case
    kw = dict(refine_slack=float("inf"), memory_cap_bytes=float("inf"), stage_points=10_000)
    off = search(model, cluster, training, options=replace(OPTIONS, embedding_loss_chunks=False), **kw)
    on = search(model, cluster, training, options=OPTIONS, **kw)
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    space = embedding_loss_space(enumerate_groups(model, training, cluster.num_gpus, OPTIONS), model, training, OPTIONS)
    t = [p.step_time_s for p in off.frontier]
    m = [p.peak_memory_bytes for p in off.frontier]
    if space is not None:
        for i in range(len(space)):
            est = estimate(model, cluster, training, embedding_loss_plan(ctx, space, i))
            t.append(est.step_time_s)
            m.append(est.fit_memory_gib * GIB)
    idx = pareto_indices(np.array(t), np.array(m))
    want = sorted(zip(np.array(t)[idx].round(12), np.array(m)[idx].round(3)))
    got = sorted((round(p.step_time_s, 12), round(p.peak_memory_bytes, 3)) for p in on.frontier)
    assert got == want


# ---- the published 405B layout for --target megatron ----------------------------------------------
def test_405b_on_256_gpus_megatron_frontier_holds_the_layout():
    hw = resolve_hardware(cluster_for_gpu("gb200").with_gpus(256), JOB405.precision, None, "megatron")
    opts = search_options("megatron", LLAMA405, JOB405)
    res = search(LLAMA405, hw.cluster, JOB405, calib=hw.calib, options=opts)
    own = [p.plan for p in res.frontier if p.plan.dims.pp * p.plan.vpp == 128]
    assert own, "no embedding / loss layout on the frontier"
    for plan in own:
        assert plan.schedule == Schedule.INTERLEAVED_1F1B
        assert plan.stage_layers == embedding_loss_split(126, 128)
        assert in_space(LLAMA405, JOB405, 256, plan, opts)
    assert in_space(LLAMA405, JOB405, 256, PUBLISHED405, opts)
    assert why_outside(LLAMA405, JOB405, 256, PUBLISHED405, opts) is None


def test_405b_layout_for_meshplan_and_torchtitan_not_deepspeed_nor_by_default():
    """meshplan's runtime runs stages holding only the embedding or the loss (its own parity test),
    torchtitan too (its default split with L + 2 stages); DeepSpeed has no interleaving, and a
    search without a target keeps at most one chunk per layer."""
    for target in ("meshplan", "torchtitan"):
        assert in_space(LLAMA405, JOB405, 256, PUBLISHED405, search_options(target, LLAMA405, JOB405)), target
    assert why_not("meshplan", LLAMA405, JOB405, PUBLISHED405) is None
    assert "more chunks than layers not for this target" in why_outside(LLAMA405, JOB405, 256, PUBLISHED405)
    assert not in_space(LLAMA405, JOB405, 256, PUBLISHED405, search_options("deepspeed", LLAMA405, JOB405))


# ---- Megatron-Core's recompute module sets ----------------------------------------------------------
def test_module_sets_of_a_subsuming_module_cost_once():
    a = (RecomputeModule.CORE_ATTN, RecomputeModule.MOE, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM)
    b = (RecomputeModule.CORE_ATTN, RecomputeModule.MOE, RecomputeModule.LAYERNORM)
    assert cost_module_code(a) == cost_module_code(b) != cost_module_code(a[2:])
    assert cost_module_code((RecomputeModule.MOE, RecomputeModule.SHARED_EXPERTS)) == cost_module_code(
        (RecomputeModule.MOE,))


@pytest.mark.parametrize("name,gpus,dims,modules", [
    ("nemotron-3-nano", 16, ParallelDims(dp_shard=16, ep=8),
     (RecomputeModule.CORE_ATTN, RecomputeModule.MOE, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM)),
    ("deepseek-v3", 256, ParallelDims(dp_shard=32, pp=8, ep=32), (RecomputeModule.MLP, RecomputeModule.MLA_UP_PROJ)),
])
def test_published_module_sets_are_searched_for_megatron(name, gpus, dims, modules):
    """Megatron-Bridge rows 342/387/430/474 (Nemotron 3 Nano) and 366 (DeepSeek-V3): in the Megatron
    target's space now, still outside meshplan's (its runtime checkpoints whole modules only)."""
    model = model_preset(name)
    training = TrainingSpec(seq_len=4096, global_batch=1024, precision=Precision.FP8)
    plan = Plan(dims=dims, zero=1, micro_batch=1, recompute=Recompute.SELECTIVE, recompute_modules=modules,
                schedule=Schedule.INTERLEAVED_1F1B if dims.pp > 1 else Schedule.ONE_F_ONE_B,
                vpp=2 if dims.pp > 1 else 1)
    megatron = search_options("megatron", model, training)
    assert why_outside(model, training, gpus, plan, megatron) is None
    assert not in_space(model, training, gpus, plan, SearchOptions())


def test_every_bridge_preset_module_set_is_searched():
    """MEGATRON_MODULE_SETS holds every --recompute-modules set a Megatron-Bridge preset uses
    (data/bridge_recipes.csv): a preset row with a new set fails here until the set is added."""
    import csv
    from pathlib import Path

    from meshplan.export.common import MEGATRON_MODULE_SETS

    rows = csv.DictReader((Path(__file__).resolve().parents[2] / "src/meshplan/data/bridge_recipes.csv").open())
    used = {cost_module_code(tuple(RecomputeModule(m) for m in r["recompute_modules"].split("+")))
            for r in rows if r["recompute_modules"]}
    searched = {cost_module_code(s) for s in MEGATRON_MODULE_SETS} | {0}  # 0: core_attn alone, the default
    assert used <= searched
