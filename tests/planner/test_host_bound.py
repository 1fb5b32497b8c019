"""Host-bound layers (cost/host.py): kernel counts by hand, and the max(device, host) switch.

One Llama-3 layer (RMSNorm, RoPE, GQA 32/8, SwiGLU), forward, counted from torchtitan's model code:
  attention: norm 8 (float, pow, mean, +eps, rsqrt, mul, type_as, *w) + wq, wk, wv, wo 4
             + RoPE 3 per q and k = 6 + repeat_kv 2 + SDPA 1 + head merge 1 + residual 1  = 23
  MLP:       norm 8 + w1, w3, w2 3 + silu 1 + gate mul 1 + residual 1                      = 14
Fused (Megatron-Core + TE): attention norm 1 + QKV 1 + proj 1 + RoPE 1 + 1 + core 1 + add 1 = 7;
  MLP norm 1 + fc1 1 + fc2 1 + swiglu 1 + add 1 = 5.
GPT-2 (LayerNorm, learned positions, GELU, MHA) eager: attention 1 + 4 + 1 + 1 + 1 = 8, MLP 1 + 2
  + 1 + 1 = 5.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.host import ffn_kernels, host_launch_s, layer_kernels, mixer_kernels
from meshplan.cost.layer import layer_cost
from meshplan.cost.step import estimate
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

LLAMA = model_preset("llama3-8b")
GPT2 = model_preset("gpt2")
H100 = system_preset("dgx-h100", 1)
A100 = system_preset("dgx-a100", 1)


def _kind(model):
    return layer_kind_counts(model)[0][0]


def _arrays(model, *plans):
    return PlanArrays.from_plans([p.with_defaults(model) for p in plans])


def test_llama_layer_kernels_by_hand():
    k = _kind(LLAMA)
    assert (mixer_kernels(LLAMA, k, fused=False), ffn_kernels(LLAMA, k, fused=False)) == (23, 14)
    assert (mixer_kernels(LLAMA, k, fused=True), ffn_kernels(LLAMA, k, fused=True)) == (7, 5)
    g = _kind(GPT2)
    assert (mixer_kernels(GPT2, g, fused=False), ffn_kernels(GPT2, g, fused=False)) == (8, 5)


def test_parallel_launches_add_to_the_layer():
    """Eager Llama layer, 37 forward kernels, 74 backward; FSDP (zero 3 over 8) adds a gather of
    3 forward, a gather and a reduce-scatter of 3 each backward; TP 2 with SP adds 2 collectives
    per sub-block each way."""
    calib = calibration_for(H100.gpu, "torchtitan")
    plans = _arrays(LLAMA, Plan(dims=ParallelDims(dp_replicate=8), zero=0), Plan(dims=ParallelDims(dp_shard=8), zero=3),
                    Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=1, sp=True))
    k = layer_kernels(LLAMA, _kind(LLAMA), plans, calib)
    np.testing.assert_array_equal(k.fwd, [37, 40, 41])
    np.testing.assert_array_equal(k.bwd, [74, 80, 78])


def test_stack_fields_reach_the_calibration():
    assert calibration_for(H100.gpu, "torchtitan").host_s_per_kernel > 0
    assert not calibration_for(H100.gpu, "torchtitan").host_fused_kernels
    assert calibration_for(H100.gpu, "megatron").host_fused_kernels
    assert host_launch_s(LLAMA, system_preset("cpu", 1), _kind(LLAMA),
                         _arrays(LLAMA, Plan(dims=ParallelDims(dp_shard=1))),
                         calibration_for(H100.gpu, "torchtitan")) == (0.0, 0.0)


def _layer(model, cluster, seq_len, micro_batch, host_s_per_kernel):
    calib = calibration_for(cluster.gpu, "torchtitan").replace_fields(host_s_per_kernel=host_s_per_kernel)
    training = TrainingSpec(seq_len=seq_len, global_batch=8 * micro_batch, precision=Precision.BF16)
    plans = _arrays(model, Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=micro_batch))
    return layer_cost(model, cluster, training, plans, calib)


@pytest.mark.parametrize("cluster", [H100, A100])
def test_small_layer_is_host_bound_large_is_not(cluster):
    """GPT-2 (D 768) at 128 tokens: the device needs a few us per layer, far less than ~13
    forward kernels x 5 us, so the layer takes the host's time exactly. Llama-3 8B at 8k tokens:
    milliseconds of GEMMs, the launches hide and the time is the device's."""
    s = 5e-6
    small, small_dev = _layer(GPT2, cluster, 128, 1, s), _layer(GPT2, cluster, 128, 1, 0.0)
    kernels = layer_kernels(GPT2, _kind(GPT2), _arrays(GPT2, Plan(dims=ParallelDims(dp_shard=8), zero=3)),
                            calibration_for(cluster.gpu, "torchtitan"))
    assert small_dev.fwd_compute_s[0] < kernels.fwd[0] * s
    np.testing.assert_allclose(small.fwd_compute_s, kernels.fwd * s)
    np.testing.assert_allclose(small.bwd_compute_s, kernels.bwd * s)
    big, big_dev = _layer(LLAMA, cluster, 8192, 1, s), _layer(LLAMA, cluster, 8192, 1, 0.0)
    np.testing.assert_allclose(big.fwd_compute_s, big_dev.fwd_compute_s)
    np.testing.assert_allclose(big.bwd_compute_s, big_dev.bwd_compute_s)


def test_faster_gpu_turns_host_bound_first():
    """A Llama-3.2-1B layer (D 2048) at micro-batch 1 x 512 tokens, eager, FSDP over 8: 37 + 3
    forward kernels x 5 us = 200 us of launches. Its ~62 GFLOP forward takes the A100 (312 TFLOP/s
    bf16) more than that and the H100 (989) less: the same layer is device-bound on the A100 and
    host-bound on the H100, where it takes exactly the launch time."""
    model, s = model_preset("llama3.2-1b"), 5e-6
    for cluster, host_bound in ((A100, False), (H100, True)):
        dev = _layer(model, cluster, 512, 1, 0.0).fwd_compute_s[0]
        both = _layer(model, cluster, 512, 1, s).fwd_compute_s[0]
        assert (dev < 40 * s) == host_bound
        assert both == pytest.approx(max(dev, 40 * s))


def test_gpt_layer_host_time_by_hand():
    """An MPT-style GPT layer (MPT-760M's dimensions: LayerNorm, MHA, GELU FFN) eager under FSDP
    over 8 (llm-foundry's held-out rows): forward 8 + 5 = 13 kernels + the gather's 3 = 16;
    backward 2 x 13 + gather 3 + reduce-scatter 3 = 32; at the stack's 5 us per kernel 80 us
    forward and 160 us backward, whatever the tokens (bench/host_share.py: a few % of a layer's
    milliseconds at 2k+ tokens on an H100)."""
    mpt = GPT2.with_overrides({"hidden_size": 1536, "num_heads": 12, "num_layers": 24})
    calib = calibration_for(H100.gpu, "torchtitan")
    plans = _arrays(mpt, Plan(dims=ParallelDims(dp_shard=8), zero=3))
    k = layer_kernels(mpt, _kind(mpt), plans, calib)
    assert (k.fwd[0], k.bwd[0]) == (16, 32)
    fwd, bwd = host_launch_s(mpt, H100, _kind(mpt), plans, calib)
    assert (fwd[0], bwd[0]) == pytest.approx((16 * 5e-6, 32 * 5e-6))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["gpt2", "llama3.2-1b", "llama3-8b", "qwen3-30b-a3b"]), micro_batch=st.sampled_from([1, 2, 4]),
       seq_len=st.sampled_from([128, 512, 1024]), tp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 3]),
       host_s=st.floats(1e-6, 1e-4), more=st.floats(1.0, 10.0), stack=st.sampled_from(["torchtitan", "megatron"]))
def test_host_time_never_makes_a_plan_faster(name, micro_batch, seq_len, tp, zero, host_s, more, stack):
    """max(device, host) per layer: a host cost per kernel, or a larger one, never shortens the step
    (the MoE model, sharded, with its experts over 2 ranks: its all-to-all hides behind the layer's time)."""
    model = model_preset(name)
    ep = 2 if model.is_moe and zero else 1  # expert parallel reuses the sharded-data ranks
    dims = (ParallelDims(dp_shard=8 // tp, tp=tp, ep=ep) if zero
            else ParallelDims(dp_replicate=8 // tp, tp=tp, ep=ep))
    plan = Plan(dims=dims, zero=zero, micro_batch=micro_batch, sp=tp > 1)
    training = TrainingSpec(seq_len=seq_len, global_batch=(8 // tp) * micro_batch * 2, precision=Precision.BF16)
    base = calibration_for(H100.gpu, stack)

    def step_s(s):
        return estimate(model, H100, training, plan, base.replace_fields(host_s_per_kernel=s)).step_time_s

    none, some, most = step_s(0.0), step_s(host_s), step_s(host_s * more)
    assert none <= some * (1 + 1e-12) and some <= most * (1 + 1e-12)
