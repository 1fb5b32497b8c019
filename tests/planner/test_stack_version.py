"""The stack's release is part of the stack (spec/stack_version.py; issue 14 items 2 and 6): the
release read from a row, what a release's presets set, and what that changes in a MoE layer's
time, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.host import host_launch_s
from meshplan.cost.layer import layer_cost
from meshplan.cost.moe import moe_cost
from meshplan.cost.precision import op_rates
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.stack_version import (
    current_release,
    known_release,
    release_notes,
    release_of,
    release_values,
)
from meshplan.spec.training import Precision, TrainingSpec

GRAPHED = {"cuda_graph_full_iteration": True, "moe_fused_grouped_mlp": True}


@pytest.mark.parametrize("framework, source, release", [
    ("megatron-core", "Megatron-Bridge 26.06.01", "26.06"),     # the container, patch dropped
    ("megatron-core", "Megatron-Bridge 25.09", "25.09"),
    ("Megatron-Core 0.16", "", "26.02"),                         # a library version: its container
    ("megatron_core v0.17.0", "", "26.04"),
    ("Megatron-Bridge 0.5.0", "", "26.06"),                      # r0.5.0 is the 26.06 container
    ("megatron-bridge 26.06", "", "26.06"),                      # a container named as framework
    ("NeMo 26.04", "", "26.04"),
    ("megatron-bridge 26.06", "Megatron-Bridge 25.09", "26.06"),  # the framework wins over the source
    ("megatron-core 0.99", "", None),                            # a version the data does not map
    ("megatron-core", "Narayanan et al. 2021, Table 1", None),   # no container anywhere
    ("", "", None),
])
def test_release_read_from_a_row(framework, source, release):
    assert release_of("megatron", framework, source) == release


def test_an_unnamed_release_or_another_stack_selects_nothing():
    # a container the data does not describe (newer, older, or another product's) is no error
    for r in ("27.02", "25.02", None):
        assert not known_release("megatron", r)
        assert release_values("megatron", r, family="qwen", gpu="gb200", precision="fp8", moe=True) == {}
    assert release_of("torchtitan", "torchtitan 0.2", "x") is None
    assert release_values("torchtitan", "26.06", family="qwen", gpu="gb200", precision="fp8", moe=True) == {}
    assert current_release("megatron") == "26.08" and current_release("deepspeed") is None


BF16_ADAM = {"adam_bytes_per_param": 4.0}
"""DeepSeek-V3's recipe: precision-aware optimizer, Adam moments in bf16 (stack_releases.json)."""
TE_LOSS = {"logits_bytes_per_element": 2.0}
"""Every performance preset: TE's fused cross entropy keeps the bf16 logits only (stack_releases.json)."""
EXPANDABLE = {"allocator_expandable_segments": True}
"""The launcher's PYTORCH_CUDA_ALLOC_CONF for Llama 3.1 405B FP8 and DeepSeek-V3 BF16 on GB200/GB300."""


@pytest.mark.parametrize("release, family, gpu, precision, moe, values", [
    ("26.04", "qwen", "gb200", "fp8", True, TE_LOSS),                                  # before the presets
    ("26.06", "qwen", "gb200", "fp8", True, {**GRAPHED, "fp8_attention": True, **TE_LOSS}),  # PR #4249
    ("26.08", "qwen", "b300", "fp8", True, {**GRAPHED, "fp8_attention": True, **TE_LOSS}),   # carried on; PR #4606
    ("26.06", "qwen", "h100-sxm", "fp8", True, TE_LOSS),                               # Hopper presets: partial graphs
    ("26.06", "qwen", "gb200", "bf16", True, TE_LOSS),                                 # MXFP8 presets only
    ("26.06", "qwen", "gb200", "fp8", False, TE_LOSS),                                 # a dense Qwen3
    ("26.06", "deepseek", "gb300", "fp8", True, {**GRAPHED, **BF16_ADAM, **TE_LOSS}),  # PR #3983 / #4226: no FP8 DPA
    ("26.06", "deepseek", "b300", "fp8", True, {**BF16_ADAM, **TE_LOSS}),
    ("25.09", "deepseek", "h100-sxm", "bf16", True, {**BF16_ADAM, **TE_LOSS}),        # the recipe's optimizer
    ("25.09", "llama", "h100-sxm", "bf16", False, TE_LOSS),
    ("26.06", "gpt", "gb200", "fp8", True, TE_LOSS),                                   # GPT-OSS entry names its model
    ("26.06", "nemotron", "gb200", "fp8", True, TE_LOSS),                              # hybrid Mamba: per-layer graphs
    ("26.06", "llama", "gb200", "fp8", False, TE_LOSS),
])
def test_release_presets_by_family_gpu_and_precision(release, family, gpu, precision, moe, values):
    got = release_values("megatron", release, family=family, gpu=gpu, precision=precision, moe=moe)
    assert got == values
    assert Calibration().replace_fields(**got)  # every value is a Calibration field
    note = release_notes("megatron", release, got)
    assert note.startswith(f"release: megatron {release}") and all(k in note for k in got)


@pytest.mark.parametrize("release, gpu, precision, values", [
    ("26.06", "gb200", "fp8", {**GRAPHED, "fp8_attention": True, **TE_LOSS}),  # PR #4173
    ("26.08", "gb300", "fp8", {**GRAPHED, "fp8_attention": True, **TE_LOSS}),  # carried on
    ("26.04", "gb300", "fp8", TE_LOSS),                                        # before the PR
    ("26.06", "gb300", "bf16", TE_LOSS),                                       # MXFP8 presets only
    ("26.06", "b300", "fp8", TE_LOSS),                                         # not dated for B300
])
def test_gpt_oss_mxfp8_presets_run_full_iteration_graphs(release, gpu, precision, values):
    """GPT-OSS 120B's MXFP8 presets on GB200 / GB300 (Megatron-Bridge PR #4173, from 26.06)."""
    got = release_values("megatron", release, family="gpt", gpu=gpu, precision=precision, moe=True,
                         model="gpt-oss-120b")
    assert got == values


@pytest.mark.parametrize("model, family, gpu, precision, moe, expandable", [
    ("llama3.1-405b", "llama", "gb200", "fp8", False, True),   # setup_experiment.py: 405B fp8 cs/mx
    ("llama3.1-405b", "llama", "gb300", "fp8", False, True),
    ("llama3.1-405b", "llama", "gb200", "fp4", False, False),  # NVFP4: not set
    ("llama3.1-405b", "llama", "b200", "fp8", False, False),   # GB200 / GB300 only
    ("llama3-70b", "llama", "gb200", "fp8", False, False),     # another Llama: not set
    ("deepseek-v3", "deepseek", "gb200", "bf16", True, True),  # dropless BF16: 'OOM if not set'
    ("deepseek-v3-nomtp", "deepseek", "gb300", "bf16", True, True),
    ("deepseek-v3", "deepseek", "gb200", "fp8", True, False),
    (None, "llama", "gb200", "fp8", False, False),             # an entry naming models needs the model
])
def test_the_launchers_allocator_setting_by_model(model, family, gpu, precision, moe, expandable):
    got = release_values("megatron", "26.02", family=family, gpu=gpu, precision=precision, moe=moe, model=model)
    assert got.get("allocator_expandable_segments", False) is expandable



@pytest.mark.parametrize("release, model, gpu, precision, graphed", [
    ("25.09", "llama3-8b", "gb200", "fp8", True),    # llama3_8b_llm_pretrain.py@0813a3f: full_iteration
    ("25.11", "llama3-8b", "b200", "fp8", True),     # workload_base_configs.py@0fa501a
    ("26.04", "llama3-8b", "gb300", "bf16", True),   # llama3_workload_base_configs.py@3dafb00
    ("25.11", "llama3-8b", "h100-sxm", "fp8", False),  # the H100 presets set no graph
    ("25.11", "llama3-8b", "gb200", "fp4", False),   # NVFP4 presets differ (GB200: impl 'none')
    ("25.11", "llama3-70b", "gb200", "fp8", False),  # another Llama: not set
])
def test_llama3_8b_blackwell_presets_run_full_iteration_graphs(release, model, gpu, precision, graphed):
    got = release_values("megatron", release, family="llama", gpu=gpu, precision=precision, moe=False, model=model)
    assert got.get("cuda_graph_full_iteration", False) is graphed

# ---- the mechanism on a small MoE case ---------------------------------------------------------

GB200 = system_preset("gb200-nvl72", 8)
QWEN = model_preset("qwen3-30b-a3b")  # 48 MoE layers, 128 experts top-8, D 2048, F 768
TRAIN = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16)
PLAN = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=1)
OLD = Calibration(host_s_per_kernel=5e-6, host_fused_kernels=True, moe_alltoall_sync_s=3e-3,
                  moe_expert_gemm_s=10e-6, moe_grouped_gemm_half_dim=1024.0)
"""A 26.04-like Megatron record: 5 us per kernel, a 3 ms launch after the token-count sync, 10 us
per expert GEMM and the grouped curve (the fitted Blackwell values are of this size)."""


def _arrays():
    return PlanArrays.from_plans([PLAN.with_defaults(QWEN)])


def _block(calib):
    arrays = _arrays()
    rates = op_rates(GB200, TRAIN, calib)
    T = arrays.micro_batch * TRAIN.seq_len / arrays.cp
    return moe_cost(QWEN, GB200, TRAIN, arrays, calib, T=T, hbm=GB200.gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency,
                    ab=2.0, bf16_flops=rates.bf16_flops, linear_flops=rates.linear_flops, gemm_time=gemm_time,
                    linear_time=gemm_time).compute_s


def test_fused_grouped_mlp_drops_the_per_expert_time_and_the_grouped_curve():
    """16 local experts (128 / ep 8), m = T k ep / E = 4096 x 8 x 8 / 128 = 2048 tokens each: the
    fused kernel saves 2 x 16 x 10 us = 320 us of per-GEMM time and runs each member on the dense
    GEMM curve (half dim 128) instead of the grouped one (1024)."""
    m, F, D = 2048.0, 768.0, 2048.0
    peak = op_rates(GB200, TRAIN, OLD).linear_flops

    def member(h, n, k):
        x = min(m, n, k)
        return 2 * m * n * k / (peak * OLD.matmul_efficiency * x / (x + h))

    experts = {h: 16 * (member(h, 2 * F, D) + member(h, D, F)) for h in (1024.0, 128.0)}
    saved = _block(OLD) - _block(OLD.replace_fields(moe_fused_grouped_mlp=True))
    np.testing.assert_allclose(saved, 2 * 16 * 10e-6 + experts[1024.0] - experts[128.0], rtol=1e-9)


def test_full_iteration_graph_removes_the_host_floor_of_a_moe_layer():
    """Before: the layer's forward is max(device, host launches + the 3 ms after the sync), which
    at one 4k sequence per GPU is the host's; under the full-iteration graph the host issues
    nothing and the forward is the device's time alone (and the backward likewise at 2x)."""
    kind = layer_kind_counts(QWEN)[0][0]
    arrays = _arrays()
    before = layer_cost(QWEN, GB200, TRAIN, arrays, OLD)
    after = layer_cost(QWEN, GB200, TRAIN, arrays, OLD.replace_fields(cuda_graph_full_iteration=True))
    launch_fwd, _ = host_launch_s(QWEN, GB200, kind, arrays, OLD)
    assert float(launch_fwd[0]) > 0 and host_launch_s(
        QWEN, GB200, kind, arrays, OLD.replace_fields(cuda_graph_full_iteration=True)) == (0.0, 0.0)
    device = float(layer_cost(QWEN, GB200, TRAIN, arrays,
                              OLD.replace_fields(moe_alltoall_sync_s=0.0, host_s_per_kernel=0.0)).fwd_compute_s[0])
    host = float(launch_fwd[0]) + OLD.moe_alltoall_sync_s
    assert host > device  # this case is host-bound before
    np.testing.assert_allclose(before.fwd_compute_s, host, rtol=1e-9)
    np.testing.assert_allclose(after.fwd_compute_s, device, rtol=1e-9)
    assert float(after.bwd_compute_s[0]) < float(before.bwd_compute_s[0])


def test_a_dense_layer_changes_only_by_its_launches():
    """A dense Llama layer has no sync and no experts: the graph only removes its host floor,
    which at 8k tokens is below its device time, so its time is the same."""
    llama = model_preset("llama3-8b")
    arrays = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=2).with_defaults(llama)])
    train = TrainingSpec(seq_len=8192, global_batch=64, precision=Precision.BF16)
    a = layer_cost(llama, GB200, train, arrays, OLD)
    b = layer_cost(llama, GB200, train, arrays, OLD.replace_fields(**GRAPHED))
    np.testing.assert_allclose(a.fwd_compute_s, b.fwd_compute_s)
    np.testing.assert_allclose(a.bwd_compute_s, b.bwd_compute_s)
