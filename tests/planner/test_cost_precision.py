"""Activation and communication bytes follow the training precision (cost.layer.activation_bytes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.cost import PlanArrays, estimate, estimate_batch
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.layer import activation_bytes, layer_cost
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

CLUSTER = system_preset("dgx-h100", 2)
# No per-message latency and no dropout masks (1 byte whatever the precision): every activation
# and every collective's time is then bytes-proportional, so fp32 is exactly 2x bf16.
PURE = replace(CLUSTER, intra_node_latency_s=0.0, inter_node_latency_s=0.0)
CALIB = calibration_for(CLUSTER.gpu).replace_fields(dropout=False, comm_half_message_bytes=0.0)

PLANS = [
    Plan(dims=ParallelDims(dp_shard=2, tp=4, cp=2), zero=1, sp=True, micro_batch=1),
    Plan(dims=ParallelDims(dp_replicate=2, tp=2, cp=4), sp=False, micro_batch=2, cp_method=CPMethod.ALL_TO_ALL),
    Plan(dims=ParallelDims(dp_shard=4, tp=4, ep=4), zero=3, sp=True, micro_batch=1, recompute=Recompute.SELECTIVE),
]


def _train(precision):
    return TrainingSpec(seq_len=4096, global_batch=64, precision=precision)


def test_bytes_per_activation_element():
    assert activation_bytes(Precision.FP32) == 4.0
    assert activation_bytes(Precision.BF16) == activation_bytes(Precision.FP16) == 2.0
    # fp8 (Transformer Engine): only GEMM inputs are cast; tensors kept/sent stay bf16
    assert activation_bytes(Precision.FP8) == 2.0


@pytest.mark.parametrize("model_name", ["llama3-8b", "mixtral-8x7b"])
def test_fp32_doubles_layer_activations_and_tp_cp_ep_traffic(model_name):
    model = model_preset(model_name)
    arrays = PlanArrays.from_plans([p.with_defaults(model) for p in PLANS])
    # Transformer Engine's fp8 storage (the Calibration default; meshplan's runtime keeps bf16)
    te = CALIB.replace_fields(fp8_saved_input_bytes_per_element=Calibration().fp8_saved_input_bytes_per_element)
    lc = {pr: layer_cost(model, PURE, _train(pr), arrays, te)
          for pr in (Precision.FP32, Precision.BF16, Precision.FP8)}
    for f in ("act_none_bytes", "act_selective_bytes", "act_full_bytes", "fwd_comm_total_s"):
        f32, f16, f8 = (getattr(lc[pr], f) for pr in (Precision.FP32, Precision.BF16, Precision.FP8))
        assert np.all(f16 > 0), f
        np.testing.assert_allclose(f32, 2.0 * f16, rtol=1e-12, err_msg=f)
        if f == "fwd_comm_total_s":  # tensors sent between GEMMs stay bf16 under fp8
            np.testing.assert_allclose(f8, f16, rtol=1e-12, err_msg=f)
        elif f != "act_full_bytes":  # TE keeps a linear's fp8 input copy, not its bf16 input
            assert np.all(f8 < f16) and np.all(f8 > 0.5 * f16), f
        else:  # full recompute keeps only the layer input, bf16
            np.testing.assert_allclose(f8, f16, rtol=1e-12, err_msg=f)
    # weights, grads and optimizer states keep their own byte rules (fp32 grads: 4 B either way here)
    np.testing.assert_allclose(lc[Precision.FP8].state_bytes, lc[Precision.BF16].state_bytes)


def test_fp32_pipeline_p2p_and_memory_bound_time_grow():
    model = model_preset("llama3-8b")
    plan = Plan(dims=ParallelDims(tp=2, pp=4, dp_replicate=2), sp=True, micro_batch=1).with_defaults(model)
    e32 = estimate(model, PURE, _train(Precision.FP32), plan, CALIB)
    e16 = estimate(model, PURE, _train(Precision.BF16), plan, CALIB)
    assert e32.time.exposed_communication_s > e16.time.exposed_communication_s
    assert e32.memory.activations_bytes > e16.memory.activations_bytes


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP8, Precision.FP16])
def test_estimate_agrees_with_estimate_batch_for_each_precision(precision):
    model = model_preset("llama3-8b")
    training = _train(precision)
    plans = [p.with_defaults(model) for p in PLANS[:2]]
    plans.append(Plan(dims=ParallelDims(tp=2, pp=4, dp_replicate=2), sp=True).with_defaults(model))
    b = estimate_batch(model, CLUSTER, training, PlanArrays.from_plans(plans), calibration_for(CLUSTER.gpu))
    for i, plan in enumerate(plans):
        est = estimate(model, CLUSTER, training, plan)
        assert b.step_time_s[i] == pytest.approx(est.step_time_s, rel=1e-9)
        assert b.peak_memory_bytes[i] / 2**30 == pytest.approx(est.peak_memory_gib, rel=1e-9)
