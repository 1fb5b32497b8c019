"""A plan's memory as a run reports it (allocated, reserved, device) and the headroom the observed
memory error asks (search/memory_margin.py; issue 14 "memory, two numbers", issue 15 item 3)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.cost.calibration import calibration_for
from meshplan.cost.step import estimate
from meshplan.plan import ParallelDims, Plan
from meshplan.search.memory_margin import MemoryMargin, job_memory_error, memory_margin, plan_margin
from meshplan.search.robust import keeps_headroom
from meshplan.search.planner import search
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

GIB = 2**30


def test_headroom_by_hand():
    # 70 GiB x 1.10 = 77.0 <= 79.7; 73 GiB x 1.10 = 80.3 > 79.7 although 73 fits
    keep = MemoryMargin(allocated_gib=66.0, reserved_gib=69.3, device_gib=69.7, fit_gib=70.0, budget_gib=79.7,
                        memory_error=0.10, error_class="all")
    assert math.isclose(keep.with_headroom_gib, 77.0) and keep.fits and keep.keeps_headroom
    tight = MemoryMargin(allocated_gib=69.0, reserved_gib=72.3, device_gib=72.7, fit_gib=73.0, budget_gib=79.7,
                         memory_error=0.10, error_class="all")
    assert math.isclose(tight.with_headroom_gib, 80.3) and tight.fits and not tight.keeps_headroom
    d = tight.to_dict()
    assert d["peak_allocated_gib"] == 69.0 and d["peak_reserved_gib"] == 72.3 and d["keeps_headroom"] is False
    assert "does NOT keep" in tight.text() and "allocated 69.0, reserved 72.3" in tight.text()


@given(fit=st.floats(1.0, 1e12), budget=st.floats(1.0, 1e12), err=st.floats(0.0, 1.0), shrink=st.floats(0.0, 1.0))
def test_headroom_is_monotone_and_implies_fitting(fit, budget, err, shrink):
    if keeps_headroom(fit, budget, err):
        assert fit <= budget  # a non-negative error never asks less than the plan itself
        assert keeps_headroom(fit * shrink, budget, err)  # a leaner plan keeps it too
    assert keeps_headroom(fit, budget, 0.0) == (fit <= budget)


def _job():
    cluster = system_preset("dgx-h100", 1)
    training = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16)
    return model_preset("llama3-8b"), cluster, training


def test_estimated_figures_by_hand():
    """dp8 ZeRO-3 on one DGX H100: one NCCL communicator (the sharded data axis), 16 channels x 2
    peers x 4 MiB = 0.125 GiB, + 0.27 GiB of CUDA context lie outside the allocator; under
    expandable segments (the H100 calibration) what must fit is the allocated peak + those."""
    model, cluster, training = _job()
    calib = calibration_for(cluster.gpu)
    assert calib.allocator_expandable_segments
    assert (calib.cuda_context_gib, calib.nccl_channels, calib.nccl_peers_per_channel,
            calib.nccl_buffer_bytes) == (0.27, 16.0, 2.0, 4 * 2**20)
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=2)
    m = plan_margin(model, cluster, training, plan, calib, 79.7)
    outside = 0.27 + 16 * 2 * 4 / 1024
    assert math.isclose(m.device_gib - m.reserved_gib, outside, rel_tol=1e-9)
    assert math.isclose(m.fit_gib - m.allocated_gib, outside, rel_tol=1e-9)
    assert m.allocated_gib < m.reserved_gib < m.device_gib
    err = job_memory_error(model, training, cluster)
    assert m.memory_error == err.memory_abs_p90 > 0 and m.error_class == err.memory_class
    assert math.isclose(m.with_headroom_gib, m.fit_gib * (1 + err.memory_abs_p90))


def test_margin_reads_the_figure_the_search_ranks():
    """The recommendation's fit figure is the frontier's (one definition of "fits")."""
    model, cluster, training = _job()
    calib = calibration_for(cluster.gpu)
    res = search(model, cluster, training, calib=calib)
    for p in (res.frontier[0], res.recommended):
        m = memory_margin(estimate(model, cluster, training, p.plan, calib), res.budget_bytes / GIB,
                          job_memory_error(model, training, cluster))
        assert m.fit_gib == pytest.approx(p.peak_memory_gib, rel=1e-9)
        assert m.fits == (p.peak_memory_bytes <= res.budget_bytes)
