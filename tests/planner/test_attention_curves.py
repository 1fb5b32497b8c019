"""A kernel's published rate curve (issue 14, item 4): FlashAttention-2 on H100 by sequence
length, head dim and mask, hand-read from Shah et al. 2024 (FlashAttention-3) Figs. 5-6, carried
by spec/presets/attention_kernels.json and applied to every stack that runs the kernel on Hopper
without a fitted record of its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import meshplan.cost.attention_kernels as ak
from meshplan.calib.validate import setting_calibration
from meshplan.cost.attention_kernels import (
    BACKWARD_FLOP_RATIO,
    figure_points,
    kernel_efficiency,
    kernel_fields,
)
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.mixers import attention_core_efficiency
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import gpu_preset
from meshplan.spec.frameworks import framework_defaults

H100_PEAK_TFLOPS = 989.0
"""H100 SXM5 dense bf16, the peak of the figure's percentages."""


def fa2_hopper() -> Calibration:
    return Calibration(**kernel_efficiency("hopper", "fa2").fields())


def model_tflops(calib: Calibration, head_dim: int, seq: int, causal: bool, backward: bool) -> float:
    """The cost model's attention rate in the figure's count (backward FLOPs 2.5x the forward's)."""
    eff = attention_core_efficiency(calib, float(head_dim), float(seq), causal, backward=backward)
    return H100_PEAK_TFLOPS * eff * (BACKWARD_FLOP_RATIO / calib.attention_backward_ratio if backward else 1.0)


def test_golden_long_causal_forward_by_hand():
    # 0.42 x 989 x 128 / (128 + 20) x 16384 / (16384 + 425) = 350.2 TFLOP/s; the figure's bar
    # (FA2, causal, head dim 128, 16k, Fig. 5) reads 335: 4.5% above it.
    assert model_tflops(fa2_hopper(), 128, 16384, causal=True, backward=False) == pytest.approx(350.2, rel=1e-3)


def test_golden_short_causal_backward_by_hand():
    # The backward at 512 causal: 2.5 / 2.7 x 0.42 x 989 x 128 / 148 x 512 / (512 + 625)
    # = 149.8 TFLOP/s (the figure has no causal backward); the non-causal 512 bar reads 214, and
    # 2.5 / 2.7 x 0.42 x 989 x 128 / 148 x 512 / (512 + 260) = 220.6, 3.1% above it.
    calib = fa2_hopper()
    assert model_tflops(calib, 128, 512, causal=True, backward=True) == pytest.approx(149.8, rel=1e-3)
    assert model_tflops(calib, 128, 512, causal=False, backward=True) == pytest.approx(220.6, rel=1e-3)


def _points():
    pts = figure_points("hopper", "fa2")
    return [(pass_, mask, int(hd), s, v) for pass_ in ("forward", "backward") for mask, by_hd in pts[pass_].items()
            for hd, vals in by_hd.items() for s, v in zip(pts["seq_len"], vals)]


@pytest.mark.parametrize(("pass_", "mask", "head_dim", "seq", "published"), _points())
def test_the_curve_reproduces_every_point_of_the_figure(pass_, mask, head_dim, seq, published):
    """Forward within 5%, backward within 3.5% of the hand-read bars (Figs. 5-6)."""
    got = model_tflops(fa2_hopper(), head_dim, seq, mask == "causal", pass_ == "backward")
    assert got == pytest.approx(published, rel=0.05 if pass_ == "forward" else 0.035)


def test_the_curve_keeps_the_figures_shape():
    calib = fa2_hopper()
    short, long_ = (model_tflops(calib, 128, s, True, False) for s in (512, 16384))
    assert short / long_ == pytest.approx(191 / 335, rel=0.06)  # the causal ramp of Fig. 5
    h64, h128 = (model_tflops(calib, h, 16384, False, False) for h in (64, 128))
    assert h64 / h128 == pytest.approx(324 / 370, rel=0.03)     # the shallow head-dim falloff


def test_stack_resolution_applies_the_curve_where_the_table_has_one():
    hopper = calibration_for(gpu_preset("h100-sxm"), "torchtitan")
    assert (hopper.attention_half_seq_causal, hopper.attention_backward_ratio) == (425.0, 2.7)
    assert "published curve of fa2 on hopper" in hopper.source
    ampere = calibration_for(gpu_preset("a100-80gb"), "torchtitan")  # no A100 curve: the defaults
    assert (ampere.attention_half_seq_causal, ampere.attention_backward_ratio) == \
        (Calibration().attention_half_seq_causal, Calibration().attention_backward_ratio)


def test_a_frameworks_own_kernel_takes_its_rate_on_the_runs_gpu():
    """llm-foundry runs MPT's Triton FlashAttention (attn_impl 'triton'): on H100 the table's
    fa1-triton entry replaces the torchtitan stack's fa2; on A100, where no entry exists, the
    stack's values stay."""
    settings = framework_defaults("llm-foundry").settings
    assert settings["attention_kernel"] == "fa1-triton"
    h100 = setting_calibration(SimpleNamespace(cluster=SimpleNamespace(gpu=gpu_preset("h100-sxm")), stack="torchtitan"),
                               None, settings)
    assert h100.attention_kernel == "fa1-triton"
    assert h100.attention_efficiency == pytest.approx(kernel_fields("hopper", "fa2")["attention_efficiency"] / 2)
    a100_run = SimpleNamespace(cluster=SimpleNamespace(gpu=gpu_preset("a100-80gb")), stack="torchtitan")
    assert setting_calibration(a100_run, None, settings).attention_efficiency == \
        calibration_for(gpu_preset("a100-80gb"), "torchtitan").attention_efficiency


def test_a_curve_naming_another_field_is_one_clear_error(monkeypatch):
    raw = dict(ak._raw())
    raw["efficiency"] = {"hopper": {"fa2": {"attention_efficiency": 0.4, "source": "x",
                                            "curve": {"matmul_efficiency": 0.9}}}}
    monkeypatch.setattr(ak, "_raw", lambda: raw)
    with pytest.raises(MeshplanError, match="hopper/fa2 curve sets matmul_efficiency; a curve may set"):
        kernel_efficiency("hopper", "fa2")


def test_a_scaled_kernel_keeps_its_lenders_curve_at_the_published_ratio():
    fa2, fa1 = kernel_efficiency("hopper", "fa2"), kernel_efficiency("hopper", "fa1-triton")
    assert fa1.attention_efficiency == pytest.approx(0.21)  # 0.42 x 0.5 (Dao 2023: FA2 ~2x FA1)
    assert fa1.curve == fa2.curve and fa1.kernel == "fa1-triton" and "Dao 2023" in fa1.source


def test_points_of_a_kernel_without_a_figure_are_one_clear_error():
    with pytest.raises(MeshplanError, match="no published figure points for cudnn on hopper"):
        figure_points("hopper", "cudnn")
