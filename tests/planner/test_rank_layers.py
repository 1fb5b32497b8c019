"""Pipeline ranks charged for the kinds of layers they hold (cost/rank_layers.py): DeepSeek-V3's
three dense first layers on rank 0, its MTP module on the rank Plan.mtp_stage names."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import estimate
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.layer import layer_cost
from meshplan.cost.pipeline import rank_of_layer_even
from meshplan.cost.rank_layers import lead_on_rank, lead_on_rank_even, rank_layer, stack_layers
from meshplan.plan import ParallelDims, Plan
from meshplan.plan.split import even_split
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import Ffn, layer_kind
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

B = 1e9


def test_deepseek_v3_dense_first_layer_params_by_hand():
    # MLA (DeepSeek-V2 Sec. 2.1): W^DQ 7168x1536 + norm 1536 + W^UQ|QR 1536x128x192
    # + W^DKV|KR 7168x576 + norm 512 + W^UK|UV 512x128x256 + W^O 128x128x7168 = 187,107,328;
    # SwiGLU 3 x 7168 x 18432 = 396,361,728; two RMSNorms 2 x 7168.
    m = model_preset("deepseek-v3")
    assert m.moe_dense_layers == 3
    assert [layer_kind(m, i).ffn for i in (0, 2, 3, 60)] == [Ffn.DENSE, Ffn.DENSE, Ffn.MOE, Ffn.MOE]
    assert m.layer_params(0) == 187_107_328 + 396_361_728 + 2 * 7168
    # an MoE layer: router 7168x256, 256 routed + 1 shared experts of 3 x 7168 x 2048
    assert m.layer_params(3) == 187_107_328 + 7168 * 256 + 257 * 3 * 7168 * 2048 + 2 * 7168


def test_deepseek_v3_totals_published():
    # DeepSeek-V3 report Sec. 4.2: 671B total, 37B activated per token (MTP module excluded).
    m = model_preset("deepseek-v3")
    assert m.num_params(include_mtp=False) / B == pytest.approx(671.0, rel=0.01)
    active = m.num_params(active_only=True, include_mtp=False)
    assert (active - m.embedding_params()) / B <= 37.0 <= active / B + 0.5


@settings(max_examples=60, deadline=None)
@given(L=st.integers(4, 64), pp=st.integers(1, 8), vpp=st.integers(1, 4), d=st.integers(1, 3))
def test_even_split_ranks_of_layers_agree_with_the_split(L, pp, vpp, d):
    if pp * vpp > L or d >= L:
        return
    split = even_split(L, pp * vpp)
    owner = [i % pp for i, n in enumerate(split) for _ in range(n)]
    assert [int(rank_of_layer_even(j, L, pp, vpp)) for j in range(L)] == owner
    m = model_preset("toy-moe").with_overrides({"num_layers": L, "moe_dense_layers": d})
    for r in range(pp):
        expected = sum(1 for j in range(d) if owner[j] == r)
        assert lead_on_rank(m, split, pp, r) == expected
        assert float(lead_on_rank_even(m, r, np.array([pp]), np.array([vpp]))[0]) == expected


def _deepseek(pp: int, **plan_fields):
    m = model_preset("deepseek-v3")
    cluster = system_preset("dgx-b200", num_nodes=4 * pp)  # 32 GPUs per pipeline rank
    n = cluster.num_gpus
    training = TrainingSpec(seq_len=4096, global_batch=n // pp * 8, precision="fp8")
    plan = Plan(dims=ParallelDims(dp_shard=n // pp, pp=pp, ep=32), micro_batch=1, zero=1, **plan_fields)
    return m, cluster, training, plan


def test_rank_parameters_sum_to_the_model_layers():
    # tp 1, ep 1 would not fit DeepSeek-V3; the parameter mix does not depend on it: with tp 1 and
    # ep 32, per rank (layers + mtp) x rank_layer's params, times ep for the experts, summed over
    # the ranks, is every layer and the MTP block exactly once.
    m, cluster, training, plan = _deepseek(4)
    plan = plan.with_defaults(m)
    arrays = PlanArrays.from_plans([plan])
    stack = stack_layers(m, cluster, training, arrays, calibration_for(cluster.gpu))
    total_dense = total_expert = 0.0
    for r in range(4):
        n, mtp = plan.layers_on_rank(r), (m.mtp_num_layers if r == plan.mtp_rank else 0)
        lay = rank_layer(stack, layers=n, lead=lead_on_rank(m, plan.stage_layers, 4, r), mtp=mtp)
        total_dense += (n + mtp) * float(lay.dense_params_per_gpu[0])
        total_expert += (n + mtp) * float((lay.params_per_gpu - lay.dense_params_per_gpu)[0]) * 32
    body = m.num_params(include_mtp=True) - m.embedding_params() - m.head_params()
    assert total_dense + total_expert == pytest.approx(body, rel=1e-9)


def test_dense_first_layers_make_rank_zero_lighter():
    # Rank 0 holds layers 0-15 of pp4 (16,15,15,15): the 3 dense ones have no all-to-all and
    # 0.58B parameters instead of 11.3B (ep 32: 0.35B of experts per GPU + 0.2B replicated).
    m, cluster, training, plan = _deepseek(4, stage_layers=(16, 16, 16, 13))
    est = estimate(m, cluster, training, plan)
    r0, r1 = est.stages[0], est.stages[1]
    assert r0.layers == r1.layers == 16
    assert r0.microbatch_time_s < r1.microbatch_time_s
    # rank 0 also holds the embedding (129280 x 7168 = 0.93B): params below rank 1's plus it
    embed_bytes = m.embedding_params() * 2  # bf16 weights, not sharded under zero 1
    assert r0.memory.parameters_bytes < r1.memory.parameters_bytes + embed_bytes


def test_mtp_stage_before_the_loss_stage_holds_embedding_and_head_copies():
    # Megatron-Core GPTModel builds the embedding and the output layer where mtp_process is set,
    # not only on the first / last stage: MTP on stage 2 of 4 (layout ...|t*13m|L).
    m, cluster, training, _ = _deepseek(4)
    last = Plan(dims=ParallelDims(dp_shard=32, pp=4, ep=32), micro_batch=1, zero=1, stage_layers=(16, 16, 16, 13))
    early = Plan(dims=ParallelDims(dp_shard=32, pp=4, ep=32), micro_batch=1, zero=1, stage_layers=(16, 16, 29, 0),
                 mtp_stage=2)
    a, b = estimate(m, cluster, training, last), estimate(m, cluster, training, early)
    assert b.stages[2].mtp_modules == 1 and a.stages[3].mtp_modules == 1
    wb = 2.0  # bf16 weights (zero 1 keeps them whole)
    copies = (m.embedding_params() + m.head_params()) * wb
    grew = b.stages[2].memory.parameters_bytes - a.stages[2].memory.parameters_bytes
    # 13 more MoE layers + the MTP block (attention + MoE + 2D x D projection + norms) + copies
    per_layer = (a.stages[1].memory.parameters_bytes - 0) / 16
    assert grew == pytest.approx(13 * per_layer + (per_layer + (2 * 7168 * 7168 + 3 * 7168) * wb) + copies,
                                 rel=0.02)


# ---- the search sees the same ranks (search/tables.py, search/even.py) ---------------------

def _small_deepseek():
    # DeepSeek-V3's shape cut to 12 layers and 32 experts: 3 dense first layers, one MTP module
    m = model_preset("deepseek-v3").with_overrides({"num_layers": 12, "moe_num_experts": 32})
    cluster = system_preset("dgx-h100", num_nodes=4)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    return m, cluster, training


def test_score_splits_matches_estimate_with_dense_first_layers_and_mtp():
    from meshplan.search.space import enumerate_space
    from meshplan.search.split_scoring import chunk_split, score_splits
    from meshplan.search.tables import CostContext, shared_layer_cost

    m, cluster, training = _small_deepseek()
    space = enumerate_space(m, training, 32)
    pick = np.flatnonzero((space.pp == 4) & (space.recompute == 2))[:6]
    assert pick.size
    ctx = CostContext(m, cluster, training, calibration_for(cluster.gpu))
    shared = shared_layer_cost(ctx, space.take(pick))
    n = np.array([[5, 2, 3, 2]] * pick.size)
    r = np.array([[5, 1, 0, 2]] * pick.size)
    got = score_splits(ctx, space.take(pick), n, r, shared.take(slice(None)), shared.take_stack(slice(None)))
    for j, i in enumerate(pick):
        layers, rec = chunk_split(n[j], r[j], int(space.vpp[i]))
        est = estimate(m, cluster, training, space.plan(int(i), layers, rec))
        assert got.step_time_s[j] == pytest.approx(est.step_time_s, rel=1e-12)
        assert got.peak_memory_bytes[j] == pytest.approx(est.fit_memory_gib * 2**30, rel=1e-12)


def test_stage_table_time_is_exact_with_dense_first_layers():
    # time is affine in (n, r) with the leading layers in rank 0's intercept: the table agrees
    # with rank_cost for any split whose rank 0 holds them all (one chunk per rank here)
    from meshplan.search.space import enumerate_space
    from meshplan.search.tables import CostContext, shared_layer_cost, stage_probes, stage_table

    m, cluster, training = _small_deepseek()
    space = enumerate_space(m, training, 32)
    pick = np.flatnonzero((space.pp == 4) & (space.vpp == 1) & (space.recompute == 2))[:4]
    assert pick.size
    ctx = CostContext(m, cluster, training, calibration_for(cluster.gpu))
    sub = space.take(pick)
    shared = shared_layer_cost(ctx, sub)
    layer, stack = shared.take(slice(None)), shared.take_stack(slice(None))
    tbl = stage_table(ctx, sub, 4, sub.vpp, layer, stage_probes(ctx, sub, layer, stack))
    n = np.array([[4, 3, 3, 2]] * pick.size)
    t, _ = tbl.rank_costs(n, np.zeros_like(n))
    from meshplan.cost.batch import rank_cost
    from meshplan.cost.pipeline import pipeline_time
    from meshplan.cost.plan_terms import num_microbatches
    alpha = pipeline_time(1.0, num_microbatches(training, sub), sub.pp, sub.vpp, sub.schedule, ctx.calib)[0]
    for rank, lead in ((0, 3), (1, 0), (3, 0)):  # rank 0: 3 dense + 1 MoE; rank 3: 2 MoE + MTP + head
        rc = rank_cost(m, cluster, training, sub, ctx.calib, layer, rank=rank, layers=n[:, rank], recomputed=0,
                       has_embedding=rank == 0, has_head=rank == 3, stack=stack, lead=lead, totals=False)
        np.testing.assert_allclose(t[:, rank], rc.microbatch_s + rc.step_extra_s / alpha, rtol=1e-9)


# ---- token-drop runs padded to capacity: no host sync per MoE layer -------------------------

def _host_bound_moe_layer(capacity):
    # 64 small experts at micro-batch 1: the device time is far below the 1 ms sync
    m = model_preset("toy-moe").with_overrides({"moe_num_experts": 64, "moe_top_k": 2})
    cluster = system_preset("dgx-b200", num_nodes=4)
    training = TrainingSpec(seq_len=256, global_batch=32, moe_capacity_factor=capacity)
    calib = calibration_for(cluster.gpu).replace_fields(moe_alltoall_sync_s=1e-3, host_s_per_kernel=0.0)
    plan = Plan(dims=ParallelDims(dp_shard=32, ep=8), micro_batch=1, zero=1)
    a = PlanArrays.from_plans([plan.with_defaults(m)])
    return float(layer_cost(m, cluster, training, a, calib).fwd_compute_s[0])


def test_padded_token_drop_skips_the_dispatch_sync():
    assert _host_bound_moe_layer(None) == pytest.approx(1e-3, rel=1e-12)  # dropless: host-bound
    assert _host_bound_moe_layer(1.0) < 0.5e-3  # fixed splits: the device's time


def test_tokendrop_rows_read_a_capacity_factor():
    from meshplan.calib.validate import load_runs
    from meshplan.data.published import runs_csv

    runs, _ = load_runs(runs_csv("megatron-bridge"))
    caps = {r.row_id: r.training.moe_capacity_factor for r in runs}
    assert caps["549"] == 1.0 and caps["546"] == 1.0  # 'Qwen3_235B_a22B (tokendrop)', 'DeepSeekV3 (tokendrop)'
    assert caps["468"] is None  # dropless


def test_full_iteration_graph_pays_no_per_layer_overhead():
    # Calibration.layer_overhead_s is the layer's launches and host dispatch: a replayed graph has none
    m = model_preset("qwen3-30b-a3b")
    cluster = system_preset("dgx-b200", num_nodes=1)
    training = TrainingSpec(seq_len=4096, global_batch=64, precision="fp8")
    a = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8, ep=8), micro_batch=1, zero=1).with_defaults(m)])
    base = calibration_for(cluster.gpu).replace_fields(moe_alltoall_sync_s=0.0, host_s_per_kernel=0.0)
    graphed = lambda ovh: layer_cost(m, cluster, training, a, base.replace_fields(  # noqa: E731
        layer_overhead_s=ovh, cuda_graph_full_iteration=True)).fwd_compute_s[0]
    eager = lambda ovh: layer_cost(m, cluster, training, a, base.replace_fields(layer_overhead_s=ovh)).fwd_compute_s[0]  # noqa: E731
    assert graphed(2e-3) == pytest.approx(graphed(0.0), rel=1e-12)
    assert eager(2e-3) == pytest.approx(eager(0.0) + 2e-3, rel=1e-9)


def test_pp1_stage_table_memory_within_the_prune_margin_of_exact():
    # The search prunes a configuration when its table memory, lowered by PRUNE_MARGIN, is
    # dominated; so the table must not overstate the exact (fit_bytes) memory by more than that.
    # Before the memory probes moved past ZeRO-3's min(2, n) gathered layers (tables.py
    # MEMORY_PROBE_LAYERS) a 12-layer pp=1 rank was overstated by 10 gathered layers (up to 2x).
    from meshplan.search.planner import PRUNE_MARGIN
    from meshplan.search.space import enumerate_space
    from meshplan.search.split_scoring import score_splits
    from meshplan.search.tables import CostContext, shared_layer_cost, stage_probes, stage_table

    m, cluster, training = _small_deepseek()
    space = enumerate_space(m, training, 32)
    pick = np.flatnonzero((space.pp == 1) & (space.recompute == 2))[::7]
    assert pick.size > 1000 and np.any(space.zero[pick] >= 3)
    ctx = CostContext(m, cluster, training, calibration_for(cluster.gpu))
    sub = space.take(pick)
    shared = shared_layer_cost(ctx, sub)
    layer, stack = shared.take(slice(None)), shared.take_stack(slice(None))
    tbl = stage_table(ctx, sub, 1, sub.vpp, layer, stage_probes(ctx, sub, layer, stack))
    L = m.num_layers
    for r in (0, 1, L // 2, L):
        n, rec = np.full((pick.size, 1), L), np.full((pick.size, 1), r)
        _, table_bytes = tbl.rank_costs(n, rec)
        exact = score_splits(ctx, sub, n, rec, layer, stack).peak_memory_bytes
        assert np.all(table_bytes[:, 0] * (1 - PRUNE_MARGIN) <= exact), r
