"""Hopper's torch stacks get the Ampere Megatron fit's GEMM fields at Hopper's share of its peak
(cost/generation_transfer.py; issue 14 items 3 and 6), and the Grand Teton H100 is its own part."""

from __future__ import annotations

import pytest

from meshplan.cost.calib_records import FittedRecord, StackRecord
from meshplan.cost.calibration import Calibration, calibration_for, fitted_records
from meshplan.cost.generation_transfer import (
    Transfer,
    carried_fields,
    generation_transfers,
)
from meshplan.cost.stack_resolution import resolve_calibration
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import gpu_preset
from meshplan.spec.gpu_names import resolve_gpu

# Bekman, ml-engineering, MAMF table: A100 SXM 267.9 / 312, H100 SXM 792.1 / 989 TFLOP/s
MAMF_RATIO = (792.1 / 989) / (267.9 / 312)  # 0.80091 / 0.85865 = 0.93276


def test_the_mamf_ratio_is_the_two_measured_fractions():
    assert generation_transfers()["hopper"].mamf_ratio == pytest.approx(0.93276, abs=1e-5)
    assert generation_transfers()["hopper"].mamf_ratio == pytest.approx(MAMF_RATIO)


@pytest.mark.parametrize("gpu, stack", [("h100-sxm", "torchtitan"), ("h100-sxm", "meshplan"),
                                        ("h200", "deepspeed"), ("h100-sxm-96gb", "torchtitan")])
def test_hopper_torch_stacks_carry_amperes_gemm_fields_at_hoppers_share(gpu, stack):
    ampere = fitted_records()["ampere/megatron"].values
    calib = calibration_for(gpu_preset(gpu), stack)
    assert calib.matmul_efficiency == pytest.approx(0.675 * MAMF_RATIO) == pytest.approx(0.6296, abs=1e-4)
    assert ampere["matmul_efficiency"] == 0.675 and calib.matmul_half_dim == ampere["matmul_half_dim"] == 64.0
    # nothing else of the Ampere record: its links and its allocator are another machine's
    assert calib.inter_node_comm_efficiency == Calibration().inter_node_comm_efficiency != ampere["inter_node_comm_efficiency"]
    assert calib.framework_overhead_gib == Calibration().framework_overhead_gib != ampere["framework_overhead_gib"]
    assert "ampere/megatron" in calib.source and "generation_transfer.json" in calib.source


def test_a_record_or_a_lender_of_the_generation_wins_over_a_transfer():
    assert calibration_for(gpu_preset("h100-sxm"), "megatron").matmul_efficiency == \
        fitted_records()["hopper/megatron"].values["matmul_efficiency"]
    assert calibration_for(gpu_preset("a100-80gb"), "torchtitan").matmul_efficiency == 0.675  # Ampere's own lender
    assert calibration_for(gpu_preset("b200"), "torchtitan").matmul_efficiency == Calibration().matmul_efficiency


def _resolve(transfer: Transfer, fitted: dict[str, FittedRecord]):
    stacks = {"s": StackRecord(stack="s", source="s", values={"layer_overhead_s": 1e-4})}
    return resolve_calibration("new", "s", fitted=fitted, stacks=stacks, lenders=(), stack_fields=("layer_overhead_s",),
                               default_kernel="fa2", transfers={"new": transfer})


def test_a_transfer_never_carries_a_stack_field_and_scales_only_fractions_of_peak():
    old = FittedRecord(key="old/x", source="fit", how="", values={"matmul_efficiency": 0.8, "matmul_half_dim": 32.0,
                                                                     "layer_overhead_s": 5e-3})
    t = Transfer(generation="new", lender="old/x", fields=("matmul_efficiency", "matmul_half_dim", "layer_overhead_s"),
                 mamf_ratio=0.5, source="test")
    values = _resolve(t, {"old/x": old}).values
    assert values["matmul_efficiency"] == pytest.approx(0.4) and values["matmul_half_dim"] == 32.0
    assert values["layer_overhead_s"] == 1e-4  # the stack's own, not the lender's


def test_a_transfer_from_a_missing_record_is_one_clear_error():
    t = Transfer(generation="new", lender="old/x", fields=("matmul_efficiency",), mamf_ratio=0.9, source="test")
    with pytest.raises(MeshplanError, match="new carries from old/x, which has no fitted record"):
        carried_fields(t, {})


def test_the_grand_teton_h100_is_a_500_w_hbm2e_part():
    """Between the H100 NVL (400 W, 835.5 TF dense bf16) and SXM (700 W, 989.4 TF), linear in the
    power limit: 835.5 + (989.4 - 835.5) x (500 - 400) / (700 - 400) = 886.8 TF; HBM2e 2.4 TB/s."""
    gt, sxm = gpu_preset("h100-sxm-96gb"), gpu_preset("h100-sxm")
    assert gt.peak_bf16_flops == pytest.approx((835.5 + (989.4 - 835.5) / 3) * 1e12, rel=1e-4)
    assert gt.peak_fp8_flops == pytest.approx((1670.5 + (1978.9 - 1670.5) / 3) * 1e12, rel=1e-4)
    assert gt.hbm_bandwidth_bytes_per_s == 2.4e12 < sxm.hbm_bandwidth_bytes_per_s
    for name in ("H100 SXM 96GB HBM2e", "H100 SXM 95GB HBM2e"):  # the torchtitan rows' names
        assert resolve_gpu(name).preset == "h100-sxm-96gb"
