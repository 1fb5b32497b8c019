"""Precision per operation, long-context attention, MoE as it runs, memory as two numbers:
the formulas of cost/precision.py, cost/mixers.py, cost/moe.py and cost/batch.py by hand."""

from __future__ import annotations

from dataclasses import replace
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.layer import layer_cost
from meshplan.cost.mixers import (
    attention_core_efficiency,
    cp_causal_imbalance,
    mixer_cost,
)
from meshplan.cost.moe import dispatch_time, moe_cost
from meshplan.cost.precision import op_rates
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

H100 = system_preset("dgx-h100", 2)
NO_LATENCY = replace(H100, intra_node_latency_s=0.0, inter_node_latency_s=0.0)
CALIB = Calibration()


def _train(precision="bf16", **kw):
    return TrainingSpec(seq_len=4096, global_batch=64, precision=precision, **kw)


def _arrays(model, *plans):
    return PlanArrays.from_plans([p.with_defaults(model) for p in plans])


# ---- item 1: precision per operation --------------------------------------------------------

def test_rates_per_operation():
    gpu = H100.gpu
    bf = op_rates(H100, _train("bf16"), CALIB)
    assert bf.linear_flops == bf.core_flops == bf.bf16_flops == gpu.peak_bf16_flops
    assert bf.cast_bytes_per_element == 0.0
    f8 = op_rates(H100, _train("fp8"), CALIB)
    assert f8.linear_flops == pytest.approx(gpu.peak_fp8_flops * 0.85)  # fp8_matmul_factor
    assert f8.core_flops == f8.bf16_flops == gpu.peak_bf16_flops  # attention core, router, head: bf16
    assert f8.cast_bytes_per_element == 4.0
    fa = op_rates(H100, _train("fp8"), CALIB.replace_fields(fp8_attention=True))
    assert fa.core_flops == pytest.approx(gpu.peak_fp8_flops * 0.85)


def test_cast_bytes_by_hand():
    """A Llama layer at tp 1: the fp8 casts read/write 4 B per element of every linear's input
    (forward) and output gradient (backward); a third of it in the forward."""
    model = model_preset("llama3-8b")
    arrays = _arrays(model, Plan(dims=ParallelDims(dp_replicate=16), micro_batch=1))
    with_cast = layer_cost(model, H100, _train("fp8"), arrays, CALIB)
    no_cast = layer_cost(model, H100, _train("fp8"), arrays, CALIB.replace_fields(lowp_cast_bytes_per_element=0.0))
    T, D, F = 4096.0, 4096.0, 14336.0
    q, kv = 4096.0, 1024.0
    elements = T * ((D + q + 2 * kv) + (q + D) + (D + 2 * F) + (F + D))  # (k + n) of QKV, proj, fc1, fc2
    hbm = H100.gpu.hbm_bandwidth_bytes_per_s * CALIB.hbm_efficiency
    np.testing.assert_allclose(with_cast.fwd_compute_s - no_cast.fwd_compute_s, 4.0 * elements / (3 * hbm),
                               rtol=1e-9)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mb=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([1024, 4096, 16384]), name=st.sampled_from(["llama3-8b", "mixtral-8x7b"]))
def test_fp8_never_slower_than_bf16_at_equal_efficiency(tp, mb, seq, name):
    """With fp8 GEMMs at the bf16 fraction of their (2x) peak and no cast cost, every GEMM is at
    least as fast and everything else the same: fp8 is never slower. (With casts it can be: the
    cast bytes of small GEMMs outweigh their halved math, which is why this needs the premise.)"""
    model = model_preset(name)
    ep = 8 // tp if model.moe_num_experts else 1
    plan = Plan(dims=ParallelDims(dp_shard=16 // tp, tp=tp, ep=ep), zero=1, sp=tp > 1, micro_batch=mb)
    arrays = _arrays(model, plan)
    calib = CALIB.replace_fields(fp8_matmul_factor=1.0, lowp_cast_bytes_per_element=0.0)
    train = TrainingSpec(seq_len=seq, global_batch=64, precision="bf16")
    lb = layer_cost(model, H100, train, arrays, calib)
    l8 = layer_cost(model, H100, replace(train, precision=Precision.FP8, recipe=None), arrays, calib)
    assert np.all(l8.fwd_compute_s <= lb.fwd_compute_s * (1 + 1e-12))


def test_fp8_memory_weight_copies_and_saved_inputs():
    model = model_preset("llama3-8b")
    plan = Plan(dims=ParallelDims(dp_replicate=16), micro_batch=1)
    e16 = estimate(model, H100, _train("bf16"), plan, CALIB)
    e8 = estimate(model, H100, _train("fp8"), plan, CALIB)
    layer_params = model.num_layers * layer_cost(model, H100, _train(), _arrays(model, plan), CALIB).params_per_gpu[0]
    assert e8.memory.parameters_bytes - e16.memory.parameters_bytes == pytest.approx(2.0 * layer_params)
    assert e8.memory.activations_bytes < e16.memory.activations_bytes


def test_fp4_keeps_first_and_last_layers_bf16():
    model = model_preset("llama3-70b")
    arrays = _arrays(model, Plan(dims=ParallelDims(dp_shard=8, tp=2), zero=1, sp=True))
    b200 = system_preset("dgx-b200", 2)
    f4 = layer_cost(model, b200, _train("fp4"), arrays, CALIB)
    all4 = layer_cost(model, b200, _train("fp4"), arrays, CALIB.replace_fields(fp4_bf16_edge_layers=0.0))
    bf = layer_cost(model, b200, _train("bf16"), arrays, CALIB)
    share = 2.0 / model.num_layers
    np.testing.assert_allclose(f4.fwd_compute_s, (1 - share) * all4.fwd_compute_s + share * bf.fwd_compute_s)


# ---- item 4: long-context attention ------------------------------------------------------------

def test_attention_efficiency_by_length_and_mask():
    c = CALIB
    # 0.55 x 128/(128+64) x 4096/(4096+1024): causal, head dim 128, 4k keys
    assert attention_core_efficiency(c, 128.0, 4096.0, True) == pytest.approx(0.55 * (2 / 3) * 0.8)
    assert attention_core_efficiency(c, 128.0, 4096.0, False) == pytest.approx(0.55 * (2 / 3) * 4096 / 4224)
    effs = [attention_core_efficiency(c, 128.0, s, True) for s in (512.0, 2048.0, 8192.0, 65536.0)]
    assert effs == sorted(effs) and effs[-1] < 0.55 * (2 / 3)


def test_attention_head_dim_falloff_is_its_own_constant():
    """FlashAttention-3's head-dim curve (Shah et al. 2024 Fig. 5: ~500/650/750 TFLOP/s at head
    dims 64/128/256) is H / (H + 64): 1/2, 2/3, 4/5 of the large-head rate, whatever the GEMM
    curve's matmul_half_dim (a fitted GEMM falloff no longer slows the attention core)."""
    long_seq = 1e12  # the sequence falloff out of the way
    for h, frac in ((64.0, 0.5), (128.0, 2 / 3), (256.0, 0.8)):
        assert attention_core_efficiency(CALIB, h, long_seq, False) == pytest.approx(0.55 * frac)
        steep_gemms = CALIB.replace_fields(matmul_half_dim=512.0)
        assert attention_core_efficiency(steep_gemms, h, long_seq, False) == pytest.approx(0.55 * frac)
    assert attention_core_efficiency(CALIB.replace_fields(attention_half_head_dim=128.0), 128.0, long_seq,
                                     False) == pytest.approx(0.55 * 0.5)


def test_mamba_scan_at_its_own_efficiency():
    """Nemotron-3-Nano's SSD scan + conv, per token forward 2*(G Q N + n Q P + 2 n N P + W conv)
    = 3,457,024 FLOPs (test_model_arch), runs at mamba_scan_efficiency of the core's peak; the
    GEMM and attention curves do not touch it."""
    model = model_preset("nemotron-3-nano")
    arrays = _arrays(model, Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=1))
    kind = next(k for k, _ in layer_kind_counts(model) if k.mixer.value == "mamba")
    kw = dict(seq_len=8192, peak=1e15, hbm=3e12, ab=2.0, gemm_time=gemm_time)
    for calib in (CALIB, CALIB.replace_fields(matmul_half_dim=512.0, attention_efficiency=0.9)):
        core = mixer_cost(model, H100, kind, arrays, calib, **kw).core_s
        np.testing.assert_allclose(core, 8192 * 3_457_024 / (1e15 * 0.05))
    slow = mixer_cost(model, H100, kind, arrays, CALIB.replace_fields(mamba_scan_efficiency=0.02), **kw).core_s
    np.testing.assert_allclose(slow, 8192 * 3_457_024 / (1e15 * 0.02))


def test_causal_cp_balance():
    c = np.array([1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(cp_causal_imbalance(CALIB, c, True), 1.0)
    contiguous = CALIB.replace_fields(cp_causal_balanced=False)
    np.testing.assert_allclose(cp_causal_imbalance(contiguous, c, True), [1.0, 1.5, 1.75, 1.875])
    np.testing.assert_allclose(cp_causal_imbalance(contiguous, c, False), 1.0)  # no mask: even
    model = model_preset("llama3-8b")
    arrays = _arrays(model, Plan(dims=ParallelDims(dp_shard=4, cp=4), zero=1, cp_method=CPMethod.RING))
    kind = layer_kind_counts(model)[0][0]
    kw = dict(seq_len=32768, peak=1e15, hbm=3e12, ab=2.0, gemm_time=gemm_time)
    even = mixer_cost(model, H100, kind, arrays, CALIB, **kw).core_s
    skew = mixer_cost(model, H100, kind, arrays, contiguous, **kw).core_s
    np.testing.assert_allclose(skew / even, 1.75)


# ---- item 2: MoE as it runs --------------------------------------------------------------------

def _moe_args(model, plan, training):
    arrays = _arrays(model, plan)
    T = arrays.micro_batch * training.seq_len / arrays.cp
    return arrays, T


@pytest.mark.parametrize("ep", [2, 4])
def test_dispatchers_by_hand(ep):
    """Qwen3-30B-A3B (k = 8): an all-gather dispatcher moves ep/k of the all-to-all's bytes."""
    model = model_preset("qwen3-30b-a3b")
    plan = Plan(dims=ParallelDims(dp_shard=ep, ep=ep), zero=1, micro_batch=1)
    a2a = _train("bf16")
    arrays, T = _moe_args(model, plan, a2a)
    t_a2a = dispatch_time(model, NO_LATENCY, a2a, arrays, CALIB, T=T, ab=2.0, load=1.0)
    t_ag = dispatch_time(model, NO_LATENCY, _train("bf16", moe_dispatcher="allgather"), arrays, CALIB,
                         T=T, ab=2.0, load=1.0)
    np.testing.assert_allclose(t_ag / t_a2a, ep / 8.0)


def test_flex_dedups_copies_per_node_and_rank():
    """ep 16 over two 8-GPU nodes, k = 8 of E = 128 experts: DeepEP sends one copy per token to
    the other node if its 64 experts hold one of the 8, 1 - C(64,8)/C(128,8), instead of
    alltoall's 8 x 8/16 = 4 over the NICs; inside one node once per picked rank, 1 - C(112,8) /
    C(128,8) of each of the 7 peers, instead of 8 x 7/8 = 7 copies."""
    model = model_preset("qwen3-30b-a3b")
    plan = Plan(dims=ParallelDims(dp_shard=16, ep=16), zero=1, micro_batch=1)
    train = _train("bf16")
    arrays, T = _moe_args(model, plan, train)
    t_a2a = dispatch_time(model, NO_LATENCY, train, arrays, CALIB, T=T, ab=2.0, load=1.0)
    t_flex = dispatch_time(model, NO_LATENCY, _train("bf16", moe_dispatcher="flex"), arrays, CALIB,
                           T=T, ab=2.0, load=1.0)
    np.testing.assert_allclose(t_flex / t_a2a, (1 - comb(64, 8) / comb(128, 8)) / 4.0)
    one_node = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=1)
    arrays, T = _moe_args(model, one_node, train)
    np.testing.assert_allclose(
        dispatch_time(model, NO_LATENCY, _train("bf16", moe_dispatcher="flex"), arrays, CALIB, T=T, ab=2.0, load=1.0)
        / dispatch_time(model, NO_LATENCY, train, arrays, CALIB, T=T, ab=2.0, load=1.0),
        7 * (1 - comb(112, 8) / comb(128, 8)) / 7.0)


def test_imbalance_capacity_and_permutation():
    model = model_preset("qwen3-30b-a3b")
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=2)
    hbm = 3e12

    def cost(calib, training):
        arrays, T = _moe_args(model, plan, training)
        return moe_cost(model, NO_LATENCY, training, arrays, calib, T=T, hbm=hbm, ab=2.0, bf16_flops=1e15,
                        linear_flops=1e15, gemm_time=gemm_time, linear_time=gemm_time)

    base = cost(CALIB, _train())
    natural = cost(CALIB.replace_fields(moe_routing_imbalance=1.3), _train())
    np.testing.assert_allclose(natural.dispatch_s / base.dispatch_s, 1.3)
    assert np.all(natural.compute_s > 1.25 * base.compute_s * 0.9)
    dropped = cost(CALIB.replace_fields(moe_routing_imbalance=1.3), _train(moe_capacity_factor=1.1))
    np.testing.assert_allclose(dropped.dispatch_s / base.dispatch_s, 1.1)
    # permutation + un-permutation: 2 kernels x (read + write) of the 2*4096 inputs and 8x copies
    no_perm = cost(CALIB.replace_fields(moe_permute_passes=0.0), _train())
    T = 2 * 4096.0
    np.testing.assert_allclose(base.compute_s - no_perm.compute_s, 4.0 * (T + 8 * T) * 2048 * 2.0 / hbm)


def _moe_block_device_s(model, arrays, training):
    """The MoE block's forward device time on H100 under CALIB, as layer_cost computes it."""
    rates = op_rates(H100, training, CALIB)
    T = arrays.micro_batch * training.seq_len / arrays.cp
    return moe_cost(model, H100, training, arrays, CALIB, T=T, hbm=H100.gpu.hbm_bandwidth_bytes_per_s * CALIB.hbm_efficiency,
                    ab=2.0, bf16_flops=rates.bf16_flops, linear_flops=rates.linear_flops, gemm_time=gemm_time,
                    linear_time=gemm_time).compute_s


def test_alltoall_host_launch_runs_beside_the_device():
    """After the dropless all-to-all's host sync the host launches one layer's work (this layer's
    experts, the next one's attention and router) while the device runs it: the layer's forward
    takes max(its device time, launch time). A launch time longer than the layer's device work
    adds exactly their difference; a shorter one adds nothing, even one longer than the MoE
    block alone; none with the all-gather dispatcher."""
    model = model_preset("mixtral-8x7b")  # every layer MoE
    arrays = _arrays(model, Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=1))
    block = float(_moe_block_device_s(model, arrays, _train())[0])
    free = layer_cost(model, H100, _train(), arrays, CALIB.replace_fields(moe_alltoall_sync_s=0.0))
    device = float(free.fwd_compute_s[0])  # the whole layer's forward on the device
    assert block < device
    for launch, extra in ((0.5 * device, 0.0), (0.5 * (block + device), 0.0), (device + 2e-3, 2e-3)):
        synced = layer_cost(model, H100, _train(), arrays, CALIB.replace_fields(moe_alltoall_sync_s=launch))
        np.testing.assert_allclose(synced.fwd_compute_s - free.fwd_compute_s, extra, atol=1e-12)
    for mb in (1, 4):
        arrays = _arrays(model, Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=mb))
        ag = _train(moe_dispatcher="allgather")
        np.testing.assert_allclose(layer_cost(model, H100, ag, arrays, CALIB).fwd_compute_s,
                                   layer_cost(model, H100, ag, arrays,
                                              CALIB.replace_fields(moe_alltoall_sync_s=0.0)).fwd_compute_s)


def test_grouped_gemm_half_dim_slows_only_the_experts():
    """The experts' grouped GEMMs follow their own curve: at tokens-per-expert m and widths 2F, D
    (F = 768, D = 2048, Qwen3-30B-A3B), each member's time is 2mnk / (peak x eff x x/(x + h))
    with x = min(m, n, k); the router, permutation and shared parts keep the GEMM curve."""
    model = model_preset("qwen3-30b-a3b")
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=1)
    train = _train()
    arrays, T = _moe_args(model, plan, train)

    def cost(calib):
        return moe_cost(model, NO_LATENCY, train, arrays, calib, T=T, hbm=3e12, ab=2.0, bf16_flops=1e15,
                        linear_flops=1e15, gemm_time=gemm_time, linear_time=gemm_time).compute_s

    m = T * 8 * 8 / 128  # tokens per expert: T x k x ep / E
    F, D = 768.0, 2048.0
    assert (model.moe_ffn_hidden_size, model.hidden_size, model.moe_num_experts) == (F, D, 128)

    def member(h, n, k):  # one (m x k) @ (k x n) grouped-GEMM member on the grouped curve
        x = min(m, n, k)
        return 2 * m * n * k / (1e15 * CALIB.matmul_efficiency * x / (x + h))

    def experts(h):  # 16 local experts, up (m x 2F x D) and down (m x D x F)
        return 16 * (member(h, 2 * F, D) + member(h, D, F))
    np.testing.assert_allclose(cost(CALIB.replace_fields(moe_grouped_gemm_half_dim=1024.0)) - cost(CALIB),
                               experts(1024.0) - experts(128.0), rtol=1e-9)


def test_moe_training_options_checked():
    with pytest.raises(MeshplanError, match="moe_dispatcher"):
        _train(moe_dispatcher="deepep")
    with pytest.raises(MeshplanError, match="moe_capacity_factor"):
        _train(moe_capacity_factor=-1.0)
    t = _train(moe_dispatcher="flex", moe_capacity_factor=1.25)
    assert TrainingSpec.from_dict(t.to_dict()) == t
    with pytest.raises(MeshplanError, match="moe_routing_imbalance"):
        Calibration(moe_routing_imbalance=0.5)


# ---- item 5: memory, two numbers --------------------------------------------------------------

def test_reserved_is_allocated_plus_fragmentation():
    model = model_preset("llama3-8b")
    est = estimate(model, H100, _train(), Plan(dims=ParallelDims(dp_shard=8, tp=2), zero=1, sp=True), CALIB)
    m = est.memory
    kept = m.parameters_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes
    assert m.reserve_bytes == pytest.approx(CALIB.allocator_fragmentation * kept)
    assert est.peak_memory_gib * 2**30 == pytest.approx(m.allocated_bytes + m.reserve_bytes)
    assert est.peak_allocated_gib * 2**30 == pytest.approx(m.allocated_bytes)
    assert est.fits == (est.peak_device_gib <= est.gpu_memory_gib)  # cost/device_memory.py: what fits means


def test_fsdp_with_pipelining_keeps_the_stage_unsharded():
    model = model_preset("llama3-8b")
    plan = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1)
    keep = estimate(model, H100, _train(), plan, CALIB)
    prefetch = estimate(model, H100, _train(), plan, CALIB.replace_fields(fsdp_pp_keeps_unsharded=False))
    layer_p = layer_cost(model, H100, _train(), _arrays(model, plan), CALIB).params_per_gpu[0]
    stage_layers = keep.stages[1].layers  # 8 layers; the prefetch policy holds 2 of them gathered
    extra = (stage_layers - 2) * layer_p * CALIB.weight_bytes_per_param * (1 - 1 / 4)
    assert keep.stages[1].memory.other_bytes - prefetch.stages[1].memory.other_bytes == pytest.approx(extra)


@pytest.mark.parametrize("ep", [2, 8])
def test_expert_gemm_fixed_time_per_local_expert(ep):
    """Qwen3-30B-A3B (128 experts): each local expert's two GEMMs pay moe_expert_gemm_s each, so
    the MoE block's forward grows by 2 x 128/ep x 10 us (ep 8: 16 experts, 320 us; ep 2: 1.28 ms)
    and the layer's forward by the same when no host floor binds."""
    model = model_preset("qwen3-30b-a3b")
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=ep), zero=1, micro_batch=1)
    train = _train()
    arrays = _arrays(model, plan)
    base_calib = CALIB.replace_fields(moe_alltoall_sync_s=0.0)
    fixed_calib = base_calib.replace_fields(moe_expert_gemm_s=10e-6)
    expected = 2.0 * (128 / ep) * 10e-6
    rates = op_rates(H100, train, CALIB)
    hbm = H100.gpu.hbm_bandwidth_bytes_per_s * CALIB.hbm_efficiency
    T = arrays.micro_batch * train.seq_len / arrays.cp

    def block(calib):
        return moe_cost(model, H100, train, arrays, calib, T=T, hbm=hbm, ab=2.0, bf16_flops=rates.bf16_flops,
                        linear_flops=rates.linear_flops, gemm_time=gemm_time, linear_time=gemm_time).compute_s

    np.testing.assert_allclose(block(fixed_calib) - block(base_calib), expected, rtol=1e-9)
    np.testing.assert_allclose(layer_cost(model, H100, train, arrays, fixed_calib).fwd_compute_s
                               - layer_cost(model, H100, train, arrays, base_calib).fwd_compute_s, expected, rtol=1e-9)
