"""calib.hardware.resolve_hardware: the one resolution of (cluster, profile, precision)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from meshplan.calib.hardware import resolve_hardware, runtime_storage
from meshplan.cost.calibration import calibration_for
from meshplan.errors import MeshplanError
from meshplan.plan import data_parallel_degree
from meshplan.spec.cluster import system_preset
from meshplan.spec.training import Precision

PROFILE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "cpu_profile_2cores.json"


def test_without_a_profile_the_family_calibration_and_storage():
    h100 = system_preset("dgx-h100", 2)
    hw = resolve_hardware(h100, Precision.BF16)
    assert hw.cluster == h100 and hw.calib == calibration_for(h100.gpu)  # bf16 on a GPU: nothing to change
    cpu = system_preset("cpu").with_gpus(2)
    hw = resolve_hardware(cpu, Precision.FP32)
    assert hw.calib == runtime_storage(calibration_for(cpu.gpu), Precision.FP32, "cpu")
    # fp32 training stores one fp32 copy and no master; malloc has no fragmentation
    assert (hw.calib.weight_bytes_per_param, hw.calib.master_bytes_per_param, hw.calib.allocator_fragmentation) == (
        4.0, 0.0, 0.0)


def test_a_profile_gives_measured_rates_and_fitted_factors():
    cpu = system_preset("cpu").with_gpus(2)
    hw = resolve_hardware(cpu, Precision.FP32, PROFILE)
    assert hw.cluster.gpu.peak_fp32_flops != cpu.gpu.peak_fp32_flops
    assert hw.cluster.intra_node_bandwidth_bytes_per_s != cpu.intra_node_bandwidth_bytes_per_s
    assert "profile:cpu_profile_2cores.json" in hw.calib.source
    assert hw.calib.tp_overlap == 0.0  # CPU ranks: communication runs on the computation's cores


def test_resolving_twice_changes_nothing():
    """A Job planned with the profile holds the measured rates already: estimate --plan FILE
    --cluster-profile resolves it again and must get the same hardware."""
    once = resolve_hardware(system_preset("cpu").with_gpus(4), Precision.FP32, PROFILE)
    twice = resolve_hardware(once.cluster, Precision.FP32, PROFILE)
    assert twice == once


def test_host_share_follows_the_process_count():
    two = resolve_hardware(system_preset("cpu").with_gpus(2), Precision.FP32, PROFILE)
    four = resolve_hardware(system_preset("cpu").with_gpus(4), Precision.FP32, PROFILE)
    assert four.cluster.gpu.peak_fp32_flops < two.cluster.gpu.peak_fp32_flops  # 4 ranks on 2 cores
    assert four.calib.layer_overhead_s > two.calib.layer_overhead_s


def test_a_bad_profile_is_one_error_naming_it(tmp_path):
    with pytest.raises(MeshplanError, match="no such profile file"):
        resolve_hardware(system_preset("cpu"), Precision.FP32, tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(MeshplanError, match="bad.json"):
        resolve_hardware(system_preset("cpu"), Precision.FP32, bad)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 4), st.integers(1, 64))
def test_dp_is_what_the_model_parallel_degrees_leave(tp, pp, cp, dp):
    assert data_parallel_degree(dp * tp * pp * cp, tp=tp, pp=pp, cp=cp) == dp


@given(st.integers(2, 8), st.integers(1, 64))
def test_a_count_the_degrees_do_not_divide_is_an_error(tp, dp):
    with pytest.raises(MeshplanError, match="not divisible by tp"):
        data_parallel_degree(dp * tp + 1, tp=tp)


def test_dp_degrees_must_be_positive():
    with pytest.raises(MeshplanError, match="tp must be a positive integer"):
        data_parallel_degree(8, tp=0)
