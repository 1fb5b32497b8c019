"""Kernels a layer's ops add to its host launches (cost/host.py ``op_kernels``), by hand.

Megatron-Core Llama-3 layer (fused: 7 + 5 forward kernels, tests/planner/test_host_bound.py) in
fp8: QKV, proj, fc1, fc2 are 4 low-precision GEMMs; each quantizes its input forward and its
output gradient backward, 3 kernels a tensor under current scaling (amax, scale, cast), 1 under
MXFP8, 3 under NVFP4 (amax, Hadamard transform, cast): +12 / +4 / +12 each way.
A token-drop MoE layer (Qwen3-30B-A3B: attention + routed experts, no shared expert) in bf16 adds its block:
13 forward, 26 backward; DeepSeek-V3's MoE layer (MLA: 5 GEMMs; one shared expert) in MXFP8:
quantize 5 + 2 + 2 = 9 a way, the block 13 + 3 = 16 forward, 32 backward.
"""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.host import layer_kernels, low_precision_gemms, op_kernels
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import Ffn, layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, Recipe, TrainingSpec

H100 = system_preset("dgx-h100", 1)
LLAMA = model_preset("llama3-8b")
QWEN = model_preset("qwen3-30b-a3b")
DSV3 = model_preset("deepseek-v3")


def _calib(on: bool):
    return calibration_for(H100.gpu, "megatron").replace_fields(host_kernels_by_op=on)


def _training(precision, recipe=None, capacity=1.0):
    return TrainingSpec(seq_len=4096, global_batch=8, precision=precision, recipe=recipe,
                        moe_capacity_factor=capacity)


def _moe_kind(model):
    return next(k for k, _ in layer_kind_counts(model) if k.ffn == Ffn.MOE)


@pytest.mark.parametrize(("precision", "recipe", "extra"), [
    (Precision.BF16, None, 0), (Precision.FP8, Recipe.TENSORWISE, 12), (Precision.FP8, Recipe.MXFP8, 4),
    (Precision.FP8, Recipe.DELAYED, 4), (Precision.FP4, Recipe.NVFP4, 12)])
def test_dense_layer_quantize_kernels_by_hand(precision, recipe, extra):
    kind = layer_kind_counts(LLAMA)[0][0]
    assert low_precision_gemms(LLAMA, kind) == 4
    assert op_kernels(LLAMA, kind, _training(precision, recipe), _calib(True)) == (extra, extra)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_replicate=8)).with_defaults(LLAMA)])
    k = layer_kernels(LLAMA, kind, plans, _calib(True), _training(precision, recipe))
    np.testing.assert_array_equal(k.fwd, [12 + extra])
    np.testing.assert_array_equal(k.bwd, [24 + extra])


def test_moe_block_kernels_by_hand():
    """Token-drop (padded, sync-free) runs launch the block as any other kernels; a dropless
    all-to-all run pays its host sync instead, which already stands for the block's launches."""
    assert op_kernels(QWEN, _moe_kind(QWEN), _training(Precision.BF16), _calib(True)) == (13, 26)
    assert op_kernels(QWEN, _moe_kind(QWEN), _training(Precision.BF16, capacity=None), _calib(True)) == (0, 0)
    kind = _moe_kind(DSV3)
    assert low_precision_gemms(DSV3, kind) == 9
    assert op_kernels(DSV3, kind, _training(Precision.FP8, Recipe.MXFP8), _calib(True)) == (9 + 16, 9 + 32)


def test_off_or_without_training_adds_nothing():
    kind = _moe_kind(DSV3)
    assert op_kernels(DSV3, kind, _training(Precision.FP8, Recipe.MXFP8), _calib(False)) == (0.0, 0.0)
    assert op_kernels(DSV3, kind, None, _calib(True)) == (0.0, 0.0)
