"""What "fits" means, one definition for estimate, plan and validate (cost/device_memory.py): the
device peak (reserved + CUDA context + NCCL buffers) within the GPU's memory; the search ranks
plans on that same figure (fit_bytes) and compares it with the memory itself. Golden numbers
worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.device_memory import FITS_BASIS, MemoryBasis, device_fits, fit_bytes
from meshplan.plan import ParallelDims, Plan, Recompute
from meshplan.search.planner import fit_budget_bytes, search
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MIB = 1024**2
H100 = system_preset("dgx-h100", 8)
MODEL = model_preset("llama3-8b")
TRAIN = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16")
PLAN = Plan(dims=ParallelDims(dp_shard=2, tp=8, pp=4), zero=1, micro_batch=1, recompute=Recompute.FULL)


def with_memory(cluster, memory_gib: float):
    return dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, memory_gib=memory_gib))


def test_fit_bytes_by_hand():
    calib = Calibration()
    # tp 8, pp 4, dp_shard 2: three communicators of 16 channels x 2 peers x 4 MiB (128 MiB each)
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    got = fit_bytes(40 * GIB, 4 * GIB, arrays, calib)[0]
    assert got == pytest.approx(40 * GIB + 0.27 * GIB + 3 * 128 * MIB)  # the reserved peak held
    expandable = calib.replace_fields(allocator_expandable_segments=True)
    got = fit_bytes(40 * GIB, 4 * GIB, arrays, expandable)[0]
    assert got == pytest.approx(36 * GIB + 0.27 * GIB + 3 * 128 * MIB)  # the allocated peak held
    assert FITS_BASIS == MemoryBasis.DEVICE


def test_fits_is_decided_on_the_device_peak():
    calib = Calibration()
    est = estimate(MODEL, H100, TRAIN, PLAN, calib)
    # a GPU that holds the reserved peak but not the context and NCCL buffers (0.27 + 0.375 GiB) on top
    between = (est.peak_memory_gib + est.peak_device_gib) / 2
    tight = estimate(MODEL, with_memory(H100, between).with_gpus(64), TRAIN, PLAN, calib)
    assert tight.peak_memory_gib < tight.gpu_memory_gib < tight.peak_device_gib
    assert not tight.fits
    assert tight.memory_shortfall_gib == pytest.approx(tight.peak_device_gib - between)
    roomy = estimate(MODEL, with_memory(H100, est.peak_device_gib + 0.01).with_gpus(64), TRAIN, PLAN, calib)
    assert roomy.fits and roomy.memory_shortfall_gib == 0.0
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    reserved = est.peak_memory_gib * GIB
    assert not device_fits(reserved, arrays, calib, between * GIB)[0]
    assert device_fits(reserved, arrays, calib, (est.peak_device_gib + 0.01) * GIB)[0]


def test_search_keeps_only_plans_that_estimate_calls_fitting():
    calib = Calibration()
    cluster = with_memory(system_preset("dgx-h100", 1), 30.0)
    train = TrainingSpec(seq_len=2048, global_batch=16, precision="bf16")
    res = search(MODEL, cluster, train, calib=calib)
    assert res.budget_bytes == fit_budget_bytes(cluster) == 30 * GIB
    assert res.fitting, "a 8B model fits 8 x 30 GiB"
    for p in res.fitting:
        est = estimate(MODEL, cluster, train, p.plan, calib)
        assert est.fits, p.plan.notation()
        assert est.peak_device_gib * GIB <= 30 * GIB
        assert p.peak_memory_bytes == pytest.approx(est.fit_memory_gib * GIB, rel=1e-9)
    # a smaller budget (--memory-gib) is a device total too
    small = search(MODEL, cluster, train, calib=calib, budget_bytes=20 * GIB)
    assert small.budget_bytes == 20 * GIB
