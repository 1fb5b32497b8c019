"""Golden values of the cost model's formulas, each derived by hand in the test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.cost import comms
from meshplan.cost.arrays import INTERLEAVED, ONE_F_ONE_B, GPIPE, PlanArrays
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.flops import model_flops_per_token, reported_flops_per_token
from meshplan.cost.layer import layer_cost
from meshplan.cost.pipeline import bubble_time, in_flight_chunks, rank_layers_even
from meshplan.plan import ParallelDims, Plan, Recompute, even_split
from meshplan.spec.cluster import system_preset
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def gpt(L=96, D=12288, N=96, V=51200, S=2048, bias=True) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=L, hidden_size=D, num_heads=N, vocab_size=V,
                     tied_embeddings=True, max_position=S, attn_bias=bias, mlp_bias=bias)


def test_model_flops_per_token_is_6n_plus_attention():
    # GPT-3 175B shape. Per layer: QKV 3D^2 + 3D bias, out D^2 + D, MLP 8D^2 + 4D + D bias,
    # two LayerNorms 4D -> 12D^2 + 15D... of which the norms (4D) do no matmul but are counted
    # in N by the PaLM convention (all non-embedding parameters).
    D, L, S, V = 12288, 96, 2048, 51200
    per_layer = 12 * D * D + 3 * D + D + 4 * D + D + 4 * D
    n = L * per_layer + 2 * D + V * D  # + final LayerNorm + (tied) LM head
    expected = 6 * n + 12 * L * S * D
    assert model_flops_per_token(gpt(), S) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(1.0757e12, rel=1e-3)  # ~6 * 174.6e9 + attention


def test_reported_flops_match_narayanan_equation():
    # Narayanan et al. 2021 eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh) per iteration with full
    # recompute. Without biases the only non-matmul parameters are LayerNorms (4h per layer).
    L, h, s, V = 24, 2304, 2048, 51200
    m = gpt(L=L, D=h, N=24, V=V, S=s, bias=False)
    per_token = 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    got = reported_flops_per_token(m, s, "full", "hardware")
    assert got == pytest.approx(per_token, rel=1e-3)
    # model basis: 72 instead of 96 (3 passes, the V term becomes V/12lh)
    model_basis = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert reported_flops_per_token(m, s, "full", "model") == pytest.approx(model_basis, rel=1e-3)


def _layer(model, plan, S=2048, calib=None):
    cluster = system_preset("dgx-a100", 1).with_gpus(plan.dims.world_size) if plan.dims.world_size <= 8 \
        else system_preset("dgx-a100", plan.dims.world_size // 8)
    calib = calib or Calibration(fused_attention=False, dropout=True)
    tr = TrainingSpec(seq_len=S, global_batch=plan.micro_batch * plan.dims.dp)
    return layer_cost(model, cluster, tr, PlanArrays.from_plans([plan]), calib)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_memory_matches_korthikanti(t):
    # Korthikanti et al. 2022 Sec. 4: per layer sbh(10 + 24/t + 5as/(ht)) bytes with TP,
    # sbh/t (34 + 5as/h) with TP + SP, 34 sbh/t with SP + selective, 2sbh with full recompute.
    s, b, h, a = 2048, 4, 6144, 64
    m = gpt(L=48, D=h, N=a)
    sbh = s * b * h
    tp = _layer(m, Plan(dims=ParallelDims(tp=t), micro_batch=b))
    assert tp.act_none_bytes[0] == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert tp.act_full_bytes[0] == pytest.approx(2 * sbh)
    if t > 1:
        sp = _layer(m, Plan(dims=ParallelDims(tp=t), sp=True, micro_batch=b))
        assert sp.act_none_bytes[0] == pytest.approx(sbh / t * (34 + 5 * a * s / h))
        assert sp.act_selective_bytes[0] == pytest.approx(34 * sbh / t)
        assert sp.act_full_bytes[0] == pytest.approx(2 * sbh / t)


def test_fused_attention_drops_the_s_squared_term_and_gqa_shrinks_kv():
    s, b, h = 2048, 1, 4096
    llama = ModelSpec(name="l", num_layers=2, hidden_size=h, num_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, gated_mlp=True, vocab_size=128256)
    lc = _layer(llama, Plan(micro_batch=b), S=s, calib=Calibration(fused_attention=True, dropout=False))
    # 8D (norm/QKV/MLP inputs) + Q, attention out (2 x 2D) + K, V (2 x 2 x 1024) + 3 x 2F (SwiGLU)
    per_token = 8 * h + 4 * h + 4 * 1024 + 6 * 14336
    assert lc.act_none_bytes[0] == pytest.approx(s * b * per_token)
    assert lc.act_none_bytes[0] == lc.act_selective_bytes[0]


def test_ring_all_reduce_moves_2_n_minus_1_over_n():
    B = 1e9
    link = comms.Link(bandwidth_bytes_per_s=np.array(100e9), latency_s=np.array(0.0))
    assert comms.all_reduce_time(B, 8, link) == pytest.approx(2 * 7 / 8 * B / 100e9)
    assert comms.all_reduce_time(B, 1, link) == 0.0
    # reduce-scatter + all-gather = all-reduce (Rabenseifner)
    assert (comms.reduce_scatter_time(B, 8, link) + comms.all_gather_time(B, 8, link)
            == pytest.approx(comms.all_reduce_time(B, 8, link)))


def test_group_inside_vs_across_nodes():
    cl = system_preset("dgx-h100", 4)
    c = Calibration(intra_node_comm_efficiency=1.0, inter_node_comm_efficiency=1.0)
    intra, inter = cl.intra_node_bandwidth_bytes_per_s, cl.inter_node_bandwidth_bytes_per_s
    cases = [(8, 1, intra), (4, 2, intra), (2, 4, intra), (4, 4, inter), (2, 8, inter), (16, 1, inter)]
    for size, stride, bw in cases:
        assert float(comms.group_link(cl, c, size, stride).bandwidth_bytes_per_s) == bw, (size, stride)


def test_exposed_never_negative_and_bounded_by_window():
    assert comms.exposed(1.0, 0.9, 10.0) == pytest.approx(0.1)
    assert comms.exposed(1.0, 0.9, 0.25) == pytest.approx(0.75)
    assert comms.exposed(1.0, 1.0, 5.0) == 0.0


def test_pipeline_bubble_and_in_flight():
    c = Calibration()
    assert bubble_time(1.0, 4, 1, ONE_F_ONE_B, c) == pytest.approx(3.0)
    assert bubble_time(1.0, 4, 2, INTERLEAVED, c) == pytest.approx(1.5)  # (p-1)/v
    p, m = 4, 16
    assert [int(in_flight_chunks(r, p, 1, m, ONE_F_ONE_B)) for r in range(p)] == [4, 3, 2, 1]
    assert int(in_flight_chunks(0, p, 1, m, GPIPE)) == m
    assert int(in_flight_chunks(0, p, 1, 2, ONE_F_ONE_B)) == 2  # never more than m
    # interleaved rank 0: p(v+1) - 1 chunks = L(1 + (p-1)/(pv)) layers' worth (Korthikanti 4.2.3)
    v = 2
    assert int(in_flight_chunks(0, p, v, m, INTERLEAVED)) == p * (v + 1) - 1


@pytest.mark.parametrize("L,p,v", [(80, 4, 1), (30, 4, 2), (7, 3, 2), (105, 35, 3), (9, 2, 1)])
def test_rank_layers_even_matches_even_split(L, p, v):
    split = even_split(L, p * v)
    for r in range(p):
        expected = sum(n for i, n in enumerate(split) if i % p == r)
        assert int(rank_layers_even(L, r, p, v)) == expected


def test_calibration_roundtrip_and_fitted_family():
    c = Calibration(matmul_efficiency=0.6)
    assert Calibration.from_dict(c.to_dict()) == c
    a100 = calibration_for(system_preset("dgx-a100").gpu)
    assert "fitted" in a100.source
    assert "meshplan stack mechanisms" in calibration_for(system_preset("dgx-h100").gpu).source
    with pytest.raises(Exception):
        Calibration(matmul_efficiency=1.5)
    with pytest.raises(Exception):
        c.replace_fields(no_such_field=1)
    assert math.isclose(c.grad_bytes_per_param(TrainingSpec(seq_len=8, global_batch=1).precision), 4.0)


def test_recompute_full_costs_a_forward():
    m = gpt(L=4, D=1024, N=16)
    lc = _layer(m, Plan(dims=ParallelDims(tp=2), recompute=Recompute.FULL))
    assert lc.recompute_full_s[0] == pytest.approx(lc.fwd_s[0])
    assert 0 < lc.recompute_selective_s[0] < lc.recompute_full_s[0]
    assert lc.bwd_compute_s[0] == pytest.approx(2 * lc.fwd_compute_s[0])
