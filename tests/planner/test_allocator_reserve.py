"""What of the caching allocator's reserve must fit the GPU (issue 14 item 5): under expandable
segments the allocator unmaps the free pages of its segments before it reports out of memory, so
"fits" counts the allocated peak there; the peak reserved, the figure a run logs, is unchanged.
And the logits Megatron-Bridge's performance runs keep under TE's fused cross entropy. Golden
numbers worked by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.device_memory import (
    device_fits,
    fit_bytes,
    held_peak_bytes,
    outside_allocator_bytes,
)
from meshplan.data.published import runs_csv
from meshplan.plan import ParallelDims, Plan, Recompute
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MIB = 1024**2
H100 = system_preset("dgx-h100", 8)
MODEL = model_preset("llama3-8b")
TRAIN = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16")
PLAN = Plan(dims=ParallelDims(dp_shard=2, tp=8, pp=4), zero=1, micro_batch=1, recompute=Recompute.FULL)
EXPANDABLE = Calibration().replace_fields(allocator_expandable_segments=True)


def test_held_peak_by_hand():
    # default allocator: a segment with a live block cannot be freed, the whole reserved peak stays
    assert held_peak_bytes(105.0 * GIB, 100.0 * GIB, Calibration()) == 105.0 * GIB
    # expandable segments: the free pages are unmapped before an OOM, the allocated peak stays
    assert held_peak_bytes(105.0 * GIB, 100.0 * GIB, EXPANDABLE) == 100.0 * GIB


def test_a_plan_between_allocated_and_reserved_fits_only_under_expandable_segments():
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    outside = outside_allocator_bytes(arrays, Calibration())[0]  # 0.27 GiB + 384 MiB (3 communicators)
    assert outside == pytest.approx(0.27 * GIB + 384 * MIB)
    memory = 80.0 * GIB
    room = memory - outside
    reserved, allocated = np.array([room * 1.02]), np.array([room * 0.98])
    assert not device_fits(held_peak_bytes(reserved, allocated, Calibration()), arrays, Calibration(), memory)[0]
    assert device_fits(held_peak_bytes(reserved, allocated, EXPANDABLE), arrays, EXPANDABLE, memory)[0]
    over = np.array([room * 1.01])  # the allocated peak itself over the room: over either way
    assert not device_fits(held_peak_bytes(over * 1.05, over, EXPANDABLE), arrays, EXPANDABLE, memory)[0]


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.2), st.booleans(), st.floats(1.0, 300.0), st.floats(0.5, 1.5))
def test_the_search_figure_fits_exactly_when_device_fits_does(frag, expandable, memory_gib, share):
    """The figure the search compares with the memory (fit_bytes) is within it exactly when
    device_fits says the plan fits, under either allocator (one test of "fits")."""
    calib = Calibration().replace_fields(allocator_fragmentation=frag, allocator_expandable_segments=expandable)
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    memory = memory_gib * GIB
    reserved = np.array([memory * share])
    allocated = reserved / (1.0 + frag)
    fits = device_fits(held_peak_bytes(reserved, allocated, calib), arrays, calib, memory)
    assert (fit_bytes(reserved, reserved - allocated, arrays, calib) <= memory)[0] == fits[0]


def test_estimate_holds_the_allocated_peak_under_expandable_segments():
    est = estimate(MODEL, H100, TRAIN, PLAN, EXPANDABLE)
    plain = estimate(MODEL, H100, TRAIN, PLAN, Calibration())
    # the logged figures do not move: the reserve is still reserved
    assert (est.peak_memory_gib, est.peak_device_gib, est.peak_allocated_gib) == (
        plain.peak_memory_gib, plain.peak_device_gib, plain.peak_allocated_gib)
    outside_gib = est.peak_device_gib - est.peak_memory_gib
    # on a GPU between the two device peaks only the expandable allocator fits
    gpu_gib = (est.peak_allocated_gib + est.peak_memory_gib) / 2 + outside_gib
    small = replace(H100, gpu=replace(H100.gpu, memory_gib=gpu_gib))
    a = estimate(MODEL, small, TRAIN, PLAN, EXPANDABLE)
    b = estimate(MODEL, small, TRAIN, PLAN, Calibration())
    assert a.fits and not b.fits
    assert a.memory_shortfall_gib == 0.0
    assert b.memory_shortfall_gib == pytest.approx(est.peak_device_gib - gpu_gib)


def _bridge_run(row_id: str):
    runs, _ = load_runs(runs_csv("megatron-bridge"))
    return next(r for r in runs if r.row_id == row_id)


def test_bridge_rows_take_the_launchers_allocator_and_the_fused_loss():
    run = _bridge_run("321")  # Llama 3.1 405B FP8, GB200, Megatron-Bridge 26.06
    assert run.release_values["allocator_expandable_segments"] is True
    assert run.release_values["logits_bytes_per_element"] == 2.0
    other = _bridge_run("352")  # Llama 3 70B FP8 GB200: the launcher leaves the allocator alone
    assert "allocator_expandable_segments" not in other.release_values


def test_fused_loss_logits_by_hand():
    """Row 352 (Llama 3 70B, mb 2 x 8192 tokens, no pipeline: the head on the only rank):
    TE's fused loss keeps 2 bytes per logit where Megatron-Core's unfused loss keeps 6."""
    run = _bridge_run("352")
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    unfused = calib.replace_fields(logits_bytes_per_element=6.0)
    a = estimate(run.model, run.cluster, run.training, run.plan, calib)
    b = estimate(run.model, run.cluster, run.training, run.plan, unfused)
    vocab = run.model.vocab_size  # 128256: tp 1, one rank holds all of it
    tokens = 2 * 8192
    assert vocab == 128256
    assert (b.memory.logits_bytes - a.memory.logits_bytes) == pytest.approx(tokens * vocab * 4.0)
    # 16384 x 128256 x 4 B = 7.83 GiB less on the rank
    assert (b.memory.logits_bytes - a.memory.logits_bytes) / GIB == pytest.approx(7.828, abs=1e-3)
