"""ZeRO-2 pays one gradient reduce-scatter per micro-batch (issue 15): pinned so the search
cannot win by charging ZeRO-2 the communication of ZeRO-1 under gradient accumulation."""

from __future__ import annotations

import pytest

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODEL = model_preset("llama3-8b")
CLUSTER = system_preset("dgx-h100", num_nodes=8)  # 64 GPUs, the gradients cross nodes


def _step_s(zero: int, global_batch: int, overlap: float, micro_batch: int = 1, seq_len: int = 4096) -> float:
    calib = calibration_for(CLUSTER.gpu).replace_fields(fsdp_overlap=overlap)
    plan = Plan(dims=ParallelDims(dp_shard=64), zero=zero, micro_batch=micro_batch)
    training = TrainingSpec(seq_len=seq_len, global_batch=global_batch)
    return estimate(MODEL, CLUSTER, training, plan, calib).step_time_s


def test_zero2_equals_zero1_with_one_microbatch():
    assert _step_s(2, 64, 0.0) == pytest.approx(_step_s(1, 64, 0.0), rel=1e-12)


def test_zero2_adds_one_reduce_scatter_per_extra_microbatch():
    """Without overlap, ZeRO-2's extra time over ZeRO-1 is (m - 1) reduce-scatters: linear in m."""
    extra = {m: _step_s(2, 64 * m, 0.0) - _step_s(1, 64 * m, 0.0) for m in (2, 8, 32)}
    assert extra[2] > 0
    assert extra[8] == pytest.approx(7 * extra[2], rel=1e-9)
    assert extra[32] == pytest.approx(31 * extra[2], rel=1e-9)


def test_zero2_reduce_scatters_hide_behind_backward_when_overlapped():
    """With full overlap and a backward longer than the reduce-scatter (16 sequences of 4K per
    micro-batch), nothing is exposed; with one sequence of 512 per micro-batch the backward is
    too short to hide it (the 8 nodes' NICs reduce-scatter 8B gradients in ~0.1 s) and ZeRO-2
    is slower."""
    assert _step_s(2, 64 * 16 * 8, 1.0, 16) == pytest.approx(_step_s(1, 64 * 16 * 8, 1.0, 16), rel=1e-9)
    assert _step_s(2, 64 * 8, 1.0, seq_len=512) > 1.2 * _step_s(1, 64 * 8, 1.0, seq_len=512)
