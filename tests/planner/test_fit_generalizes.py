"""What keeps a fit from absorbing one family's costs into constants every row shares: the prior
that holds a constant at its start unless the rows pay for moving it (calib/fit.py), and a
MoE-only grouped-GEMM efficiency that dense rows never see (cost/moe.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from meshplan.calib.fit import fit_rows, grid_position, prior_penalty, run_start
from meshplan.calib.validate import build_run, predicted_metric
from meshplan.cost import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.moe import moe_cost
from meshplan.cost.step import estimate
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

ROW = dict(id="1", source="Synth2024 Table 1", model="GPT", num_layers="8", hidden_size="2048",
           num_heads="16", vocab_size="51200", seq_len="2048", gpu="a100-80gb", num_gpus="16",
           gpus_per_node="8", global_batch_size="64", micro_batch_size="2", tp="2", pp="2",
           recompute="full", precision="fp16", flops_basis="hardware", measured_tflops_per_gpu="1",
           measured_peak_mem_gib="1", notes="")
GRID = {"matmul_efficiency": (0.5, 0.55, 0.6, 0.65, 0.7)}


def _synth(truth: dict, **changes):
    run = build_run({**ROW, **changes})
    calib = run_start(run).replace_fields(**truth)
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    return replace(run, measured=predicted_metric(run, est.step_time_s))


def test_grid_position_and_penalty_by_hand():
    assert grid_position((0.5, 0.6, 0.7), 0.65) == pytest.approx(0.75)
    assert grid_position((0.5, 0.6, 0.7), 0.9) == pytest.approx(1.0)  # clamped to the grid's ends
    start = Calibration(matmul_efficiency=0.7)
    # matmul_efficiency's range is [0.45, 0.90] on a log scale (calib/priors.py): 0.55 from 0.7
    # crosses ln(0.7/0.55) / ln(2) = 0.348 of it
    assert prior_penalty(start.replace_fields(matmul_efficiency=0.55), start, GRID, 0.02) == pytest.approx(
        0.02 * math.log(0.7 / 0.55) / math.log(2.0))
    assert prior_penalty(start, start, GRID, 0.02) == 0.0
    # a field without a physical range (a memory field) pays its grid distance: 1/4 of (0, 2)
    mem = {"framework_overhead_gib": (0.0, 1.0, 2.0)}
    c0 = Calibration(framework_overhead_gib=1.0)
    assert prior_penalty(c0.replace_fields(framework_overhead_gib=1.5), c0, mem, 0.02) == pytest.approx(0.005)


def test_prior_holds_a_constant_the_rows_do_not_pay_for():
    """Rows made at matmul_efficiency 0.6 (start 0.70): with no prior the fit recovers 0.6; a
    prior worth more than the rows' whole log error keeps the start; a weak one lets it move."""
    runs = [_synth({"matmul_efficiency": 0.6}, tp=str(t), micro_batch_size=str(mb), num_gpus=str(t * 8))
            for t, mb in [(1, 2), (2, 2), (4, 1), (8, 4)]]
    settings = runs[0].settings
    assert run_start(runs[0], settings).matmul_efficiency == pytest.approx(0.7)
    free = fit_rows(runs, "ampere/megatron", "megatron", settings, time_grid=GRID, memory_grid={}, prior_weight=0.0)
    assert free.values["matmul_efficiency"] == pytest.approx(0.6)
    held = fit_rows(runs, "ampere/megatron", "megatron", settings, time_grid=GRID, memory_grid={}, prior_weight=10.0)
    assert "matmul_efficiency" not in held.values  # stayed at its start
    weak = fit_rows(runs, "ampere/megatron", "megatron", settings, time_grid=GRID, memory_grid={}, prior_weight=1e-4)
    assert weak.values["matmul_efficiency"] == pytest.approx(0.6)


def test_grouped_gemm_efficiency_slows_only_the_routed_experts():
    """Qwen3-30B-A3B at ep 8: halving moe_grouped_gemm_efficiency doubles the routed experts'
    GEMM time (16 local experts, up m x 2F x D and down m x D x F on the grouped curve) and
    nothing else of the MoE block; a fused grouped MLP ignores it."""
    model = model_preset("qwen3-30b-a3b")
    cluster = replace(system_preset("dgx-h100", 2), intra_node_latency_s=0.0, inter_node_latency_s=0.0)
    train = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16")
    arrays = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, micro_batch=1).with_defaults(model)])
    T = arrays.micro_batch * train.seq_len / arrays.cp

    def cost(calib):
        return moe_cost(model, cluster, train, arrays, calib, T=T, hbm=3e12, ab=2.0, bf16_flops=1e15,
                        linear_flops=1e15, gemm_time=gemm_time, linear_time=gemm_time).compute_s

    base = Calibration()
    m, F, D, h = T * 8 * 8 / 128, 768.0, 2048.0, base.moe_grouped_gemm_half_dim

    def member(n, k):
        x = min(m, n, k)
        return 2 * m * n * k / (1e15 * base.matmul_efficiency * x / (x + h))
    experts = 16 * (member(2 * F, D) + member(D, F))
    np.testing.assert_allclose(cost(base.replace_fields(moe_grouped_gemm_efficiency=0.5)) - cost(base),
                               experts, rtol=1e-9)
    fused = base.replace_fields(moe_fused_grouped_mlp=True)
    np.testing.assert_allclose(cost(fused.replace_fields(moe_grouped_gemm_efficiency=0.5)), cost(fused), rtol=1e-12)


def test_dense_rows_never_see_the_grouped_gemm_efficiency():
    run = build_run(ROW)
    base = run_start(run)
    a = estimate(run.model, run.cluster, run.training, run.plan, base).step_time_s
    b = estimate(run.model, run.cluster, run.training, run.plan,
                 base.replace_fields(moe_grouped_gemm_efficiency=0.5)).step_time_s
    assert a == b


@pytest.mark.parametrize("bad", [0.0, 1.5])
def test_grouped_gemm_efficiency_checked(bad):
    with pytest.raises(MeshplanError, match="moe_grouped_gemm_efficiency"):
        Calibration(moe_grouped_gemm_efficiency=bad)


def test_specific_first_fits_the_moe_only_field_and_leaves_it_on_dense_rows():
    """Dense rows cannot move the MoE-only grouped-GEMM efficiency, whatever the sweep order."""
    runs = [_synth({"matmul_efficiency": 0.6}, tp=str(t), micro_batch_size=str(mb), num_gpus=str(t * 8))
            for t, mb in [(1, 2), (2, 2), (4, 1), (8, 4), (2, 1), (4, 2), (1, 4), (8, 1), (2, 4), (4, 4)]]
    res = fit_rows(runs, "ampere/megatron", "megatron", runs[0].settings,
                   time_grid={**GRID, "fp8_matmul_factor": (0.8, 0.9)}, memory_grid={}, specific_first=True)
    assert res.values["matmul_efficiency"] == pytest.approx(0.6)
    assert "moe_grouped_gemm_efficiency" not in res.values and "fp8_matmul_factor" not in res.values
