"""The fitting routine recovers factors from runs synthesised with known factors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.calib.fit import calibration_key, fit_rows, run_start, source_group
from meshplan.cost.step import estimate
from meshplan.calib.validate import build_run, predicted_metric

ROW = dict(id="1", source="Synth2024 Table 1", model="GPT", num_layers="8", hidden_size="2048",
           num_heads="16", vocab_size="51200", seq_len="2048", gpu="a100-80gb", num_gpus="16",
           gpus_per_node="8", global_batch_size="64", micro_batch_size="2", tp="2", pp="2",
           recompute="full", precision="fp16", flops_basis="hardware", measured_tflops_per_gpu="1",
           measured_peak_mem_gib="1", notes="")


def synth(truth: dict, **changes) -> object:
    run = build_run({**ROW, **changes})
    calib = run_start(run).replace_fields(**truth)  # the fit's own start
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    return replace(run, measured=predicted_metric(run, est.step_time_s),
                   measured_memory_gib=est.peak_memory_gib)


def test_fit_recovers_known_factors():
    truth = {"matmul_efficiency": 0.6, "framework_overhead_gib": 4.0}
    runs = [synth(truth, tp=str(t), pp=str(p), micro_batch_size=str(mb), num_gpus=str(t * p * 4))
            for t, p, mb in [(1, 1, 2), (2, 2, 2), (2, 1, 4), (4, 2, 1), (8, 1, 2), (1, 4, 1),
                             (2, 4, 2), (4, 1, 4), (8, 2, 1), (1, 2, 4), (2, 8, 1)]]
    assert {calibration_key(r) for r in runs} == {"ampere/megatron"}
    res = fit_rows(runs, "ampere/megatron", "megatron", runs[0].settings,
                     time_grid={"matmul_efficiency": (0.5, 0.55, 0.6, 0.65, 0.7)},
                     memory_grid={"framework_overhead_gib": (2.0, 3.0, 4.0, 5.0)})
    assert res.values["matmul_efficiency"] == pytest.approx(0.6)
    assert res.values["framework_overhead_gib"] == pytest.approx(4.0)
    assert res.throughput_error_after == pytest.approx(0.0, abs=1e-9)
    assert res.memory_error_after == pytest.approx(0.0, abs=1e-9)
    assert source_group(runs[0]) == "Synth2024"


def test_fit_leaves_the_fields_the_framework_fixes():
    """A row of Megatron-LM 2020-22 had no TP overlap: tp_overlap is a setting, never fitted."""
    truth = {"matmul_efficiency": 0.6}
    runs = [synth(truth, tp=str(t), num_gpus=str(t * 8)) for t in (1, 2, 4, 8)]
    res = fit_rows(runs, "ampere/megatron", "megatron", runs[0].settings,
                   time_grid={"tp_overlap": (0.0, 0.5, 1.0), "matmul_efficiency": (0.5, 0.6, 0.7)},
                   memory_grid={})
    assert "tp_overlap" not in res.values and runs[0].settings["tp_overlap"] == 0.0
