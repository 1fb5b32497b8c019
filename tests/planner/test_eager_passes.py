"""Eager memory passes (cost/eager_passes.py): bytes by hand, and where they apply.

One Llama-3-8B layer (D 4096, 32 heads / 8 KV heads of 128, F 14336, RMSNorm, RoPE, SwiGLU) in
bf16 (ab = 2), per token, forward, beyond layer.py's one fused pass per op:
  RMSNorm x2:  eager x.float() 2+4, pow 4+4, mean 4, mul 4+4, type_as 4+2, * w 2+2 = 36 B/elem,
               fused 2+2 = 4: 32 x 4096 x 2 norms                                   = 262,144
  RoPE:        float 2+4, complex mul 4+4, type_as 4+2 = 20 B/elem of q (4096) and k (1024)
                                                                                   = 102,400
  repeat_kv:   K and V each read 1024 x 2 B and write 4096 x 2 B: 2 x 5120 x 2      =  20,480
  SwiGLU:      silu 2+2, mul 4+2 = 10 B/elem of F, fused 6: 4 x 14336               =  57,344
                                                                            total   = 442,368
Under TP 2 with sequence parallel every term halves (norms see T / 2 tokens, the rest D / 2).
"""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.eager_passes import (
    eager_extra_bytes,
    rmsnorm_extra_bytes,
    rope_bytes,
    runs_eager,
)
from meshplan.cost.layer import layer_cost
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

LLAMA = model_preset("llama3-8b")
GPT2 = model_preset("gpt2")
H100 = system_preset("dgx-h100", 1)


def _kind(model):
    return layer_kind_counts(model)[0][0]


def test_llama_layer_bytes_by_hand():
    per_token = eager_extra_bytes(LLAMA, _kind(LLAMA), tokens=1.0, tokens_replicated=1.0, tp=1.0, ab=2.0)
    assert per_token == pytest.approx(442_368)
    tp2 = eager_extra_bytes(LLAMA, _kind(LLAMA), tokens=1.0, tokens_replicated=0.5, tp=2.0, ab=2.0)
    assert tp2 == pytest.approx(442_368 / 2)


def test_fp32_activations_have_no_casts():
    """fp32: x.float() and type_as are no-ops: the norm's pow 8, mean 4, mul 8, * w 8 = 28, less
    the fused 8; the rotary embedding's complex mul alone, 8."""
    assert rmsnorm_extra_bytes(4.0) == 20.0
    assert rope_bytes(4.0) == 8.0


def test_gpt_layer_runs_the_same_passes_eager_and_fused():
    """LayerNorm, learned positions, MHA, GELU: one pass per op either way (MPT, GPT-2)."""
    assert eager_extra_bytes(GPT2, _kind(GPT2), tokens=1.0, tokens_replicated=1.0, tp=1.0, ab=2.0) == 0.0


def test_eager_stack_pays_the_passes_on_a_gpu_only():
    """A stack running eager model code pays the extra bytes / (W_hbm x hbm_efficiency) in the
    forward, 2x in the backward; a fused one and a CPU device (whose elementwise probe measures
    the eager modules themselves) pay none; meshplan's runtime fuses its norm and shares K/V
    heads in SDPA, so its stack does not set the field."""
    training = TrainingSpec(seq_len=8192, global_batch=8, precision=Precision.BF16)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=3).with_defaults(LLAMA)])
    eager = calibration_for(H100.gpu, "torchtitan").replace_fields(host_s_per_kernel=0.0)  # the stack's own
    fused = eager.replace_fields(eager_memory_passes=False)  # as the torchtitan-compile framework's runs
    assert runs_eager(H100, eager) and not runs_eager(H100, fused)
    assert not runs_eager(system_preset("cpu", 1), eager)
    assert not calibration_for(H100.gpu, "meshplan").eager_memory_passes
    a, b = layer_cost(LLAMA, H100, training, plans, eager), layer_cost(LLAMA, H100, training, plans, fused)
    hbm = H100.gpu.hbm_bandwidth_bytes_per_s * eager.hbm_efficiency
    extra_s = 442_368 * 8192 / hbm * eager.elementwise_time_factor
    np.testing.assert_allclose(a.fwd_compute_s - b.fwd_compute_s, extra_s, rtol=1e-9)
    np.testing.assert_allclose(a.bwd_compute_s - b.bwd_compute_s, 2 * extra_s, rtol=1e-9)


def test_torchtitan_rows_run_eager_compiled_rows_fused():
    """The torchtitan stack (compile.enable off by default) sets eager_memory_passes in its own
    record, so `estimate --target torchtitan` pays them too; 'torchtitan-compile' runs are fused
    on both the host (kernel counts) and the device; llm-foundry's MPT code is not the counted
    Llama code."""
    from meshplan.spec.frameworks import framework_defaults

    assert calibration_for(H100.gpu, "torchtitan").eager_memory_passes is True
    assert "eager_memory_passes" not in framework_defaults("torchtitan").settings
    assert framework_defaults("llm-foundry").settings["eager_memory_passes"] is False
    compiled = framework_defaults("torchtitan-compile").settings
    assert compiled["host_fused_kernels"] is True and not compiled.get("eager_memory_passes", False)
    assert framework_defaults("torchtitan-compile").stack == "torchtitan"


def test_compiled_llama_still_copies_k_and_v_per_query_head():
    """torch.compile fuses the norm, RoPE and SwiGLU passes, not repeat_kv's copy (a reshape of an
    expand feeding SDPA): 20,480 B a token forward (module docstring), 2x backward, and only
    where K/V heads are fewer than query heads."""
    from meshplan.cost.eager_passes import repeat_kv_bytes
    from meshplan.spec.frameworks import framework_defaults

    assert repeat_kv_bytes(LLAMA, _kind(LLAMA), tokens=1.0, tp=1.0, ab=2.0) == pytest.approx(20_480)
    assert repeat_kv_bytes(LLAMA, _kind(LLAMA), tokens=1.0, tp=2.0, ab=2.0) == pytest.approx(10_240)
    assert repeat_kv_bytes(GPT2, _kind(GPT2), tokens=1.0, tp=1.0, ab=2.0) == 0.0  # MHA: no copy
    assert framework_defaults("torchtitan-compile").settings["repeat_kv_copy"] is True
    training = TrainingSpec(seq_len=8192, global_batch=8, precision=Precision.BF16)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=3).with_defaults(LLAMA)])
    fused = calibration_for(H100.gpu, "torchtitan").replace_fields(host_s_per_kernel=0.0,
                                                                  eager_memory_passes=False)
    compiled = fused.replace_fields(repeat_kv_copy=True)
    a, b = layer_cost(LLAMA, H100, training, plans, compiled), layer_cost(LLAMA, H100, training, plans, fused)
    extra_s = 20_480 * 8192 / (H100.gpu.hbm_bandwidth_bytes_per_s * fused.hbm_efficiency) * fused.elementwise_time_factor
    np.testing.assert_allclose(a.fwd_compute_s - b.fwd_compute_s, extra_s, rtol=1e-9)
    np.testing.assert_allclose(a.bwd_compute_s - b.bwd_compute_s, 2 * extra_s, rtol=1e-9)
    # eager runs count the copy once, among their other passes
    eager = fused.replace_fields(eager_memory_passes=True)
    both = eager.replace_fields(repeat_kv_copy=True)
    np.testing.assert_allclose(layer_cost(LLAMA, H100, training, plans, both).fwd_compute_s,
                               layer_cost(LLAMA, H100, training, plans, eager).fwd_compute_s, rtol=1e-12)
