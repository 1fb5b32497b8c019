"""Tensor parallel's all-gathers in fp8 (Calibration.fp8_tp_all_gather: torchtitan's float8 TP,
torchao Float8ColwiseParallel / Float8RowwiseParallel under a tensorwise recipe). By hand on a
100 GB/s link without latency: an 80 MB bf16 activation over 8 ranks all-gathers or
reduce-scatters in 7/8 x 80e6 / 100e9 = 0.7 ms, its fp8 copy (40 MB) all-gathers in 0.35 ms."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost.calibration import Calibration
from meshplan.cost.comms import Link
from meshplan.cost.precision import tp_gather_bytes_per_element
from meshplan.cost.step import estimate
from meshplan.cost.tp_backward import tp_backward
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.training import Precision, Recipe

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "bench" / "data" / "runs_heldout.csv"
MSG_BYTES = 80e6
RING_S = 7 / 8 * MSG_BYTES / 100e9
MS = 1e-3


def _training(precision: Precision, recipe: Recipe | None):
    run = next(r for r in load_runs(HELDOUT)[0] if r.row_id == "tt-11")
    return replace(run.training, precision=precision, recipe=recipe)


@pytest.mark.parametrize(("flag", "precision", "recipe", "want"), [
    (True, Precision.FP8, Recipe.TENSORWISE, 1.0),
    (True, Precision.FP8, Recipe.ROWWISE, 2.0),  # torchtitan: regular TP for rowwise recipes
    (True, Precision.BF16, None, 2.0),
    (False, Precision.FP8, Recipe.TENSORWISE, 2.0),
])
def test_gather_bytes_per_element(flag, precision, recipe, want):
    calib = Calibration(fp8_tp_all_gather=flag)
    assert tp_gather_bytes_per_element(_training(precision, recipe), calib, 2.0) == want


def test_backward_gathers_the_output_gradient_in_fp8_and_reduce_scatters_in_bf16():
    calib = Calibration(sp_saves_gathered_inputs=True, comm_half_message_bytes=0.0)
    link = Link(bandwidth_bytes_per_s=np.array([100e9]), latency_s=np.array([0.0]), calib=calib)
    got = tp_backward(calib, sp=np.array([True]), parts=2.0, act_msg_bytes=np.array([MSG_BYTES]),
                      gather_msg_bytes=np.array([MSG_BYTES / 2]), tp=np.array([8.0]), tp_link=link,
                      bwd_device_s=np.array([50 * MS]), gemm_s=np.array([10 * MS]))
    # per sub-block: the gradient all-gather at half the bytes + the input-gradient reduce-scatter
    assert got.total_s[0] == pytest.approx(2 * (RING_S / 2 + RING_S))


def test_only_the_torchtitan_stacks_gather_in_fp8():
    for name in ("torchtitan", "torchtitan-compile"):
        assert framework_defaults(name).settings["fp8_tp_all_gather"] is True
    for name in ("megatron-core", "megatron-lm", "deepspeed", "llm-foundry", "unstated"):
        assert not framework_defaults(name).settings.get("fp8_tp_all_gather", False)


def _step_s(row_id: str, flag: bool) -> float:
    run = next(r for r in load_runs(HELDOUT)[0] if r.row_id == row_id)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values}).replace_fields(
        fp8_tp_all_gather=flag)
    return estimate(run.model, run.cluster, run.training, run.plan, calib).step_time_s


def test_fp8_tp_gathers_shorten_a_tensor_parallel_fp8_step_and_leave_bf16_alone():
    # tt-11: Llama 3.1 70B, torchtitan FSDP 32 x TP 8 (SP), Float8 tensorwise; tt-h1: 405B bf16, TP 8
    assert _step_s("tt-11", True) < _step_s("tt-11", False)
    assert _step_s("tt-h1", True) == _step_s("tt-h1", False)
