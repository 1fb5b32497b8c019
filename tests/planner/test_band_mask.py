"""A sliding-window band costed as the causal kernel it runs like (cost/band_mask.py; GPT-OSS's
window of 128 on alternate layers, issue 14). Golden values by hand."""

from __future__ import annotations

import pytest

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.band_mask import band_equivalent_causal_keys
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.mixers import mixer_cost
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import Ffn, LayerKind, Mixer
from meshplan.spec.presets import model_preset

CAL = Calibration()


def test_band_equivalent_causal_keys_golden():
    assert band_equivalent_causal_keys(128, 4096) == 256  # GPT-OSS: a causal kernel over 256 keys
    assert band_equivalent_causal_keys(3000, 4096) == 4096  # 2w past the sequence: the sequence
    assert band_equivalent_causal_keys(128, 200) == 200


def _sliding_core_s(calib: Calibration, sliding: bool = True) -> float:
    model = model_preset("gpt-oss-120b")
    cluster = system_preset("dgx-b200", num_nodes=1)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=1)])
    kind = LayerKind(mixer=Mixer.ATTENTION, ffn=Ffn.MOE, sliding=sliding)
    mix = mixer_cost(model, cluster, kind, plans, calib, seq_len=4096, peak=2.25e15, hbm=8e12, ab=2.0,
                     gemm_time=gemm_time, core_peak=2.25e15)
    return float(mix.core_s[0])


def test_sliding_layer_core_golden():
    """GPT-OSS-120B sliding layer, 1 x 4096 tokens, 64 heads of 64, window 128, on B200 (bf16 2.25 PF,
    SFU at the reference rate): FLOPs 2 x 4096 x 128 x 64 x (64 + 64) = 8,589,934,592 (no causal
    halving: each query has its 128 keys); efficiency on the causal curve at 2 x 128 = 256 keys:
    0.55 x 64 / (64 + 64) x 256 / (256 + 1024) = 0.055; exponentials at head dim 64: 1.4.
    8,589,934,592 / (2.25e15 x 0.055) x 1.4 = 97.178 us."""
    assert _sliding_core_s(CAL) == pytest.approx(8_589_934_592 / (2.25e15 * 0.055) * 1.4, rel=1e-9)
    assert _sliding_core_s(CAL) == pytest.approx(97.178e-6, rel=1e-4)


def test_the_band_follows_the_causal_curve_not_the_dense_one():
    # moving the dense curve leaves the band alone; moving the causal curve moves it
    assert _sliding_core_s(CAL.replace_fields(attention_half_seq=4096.0)) == pytest.approx(_sliding_core_s(CAL))
    slower = _sliding_core_s(CAL.replace_fields(attention_half_seq_causal=2048.0))
    # (256 + 2048) / (256 + 1024) = 1.8x
    assert slower == pytest.approx(1.8 * _sliding_core_s(CAL), rel=1e-9)


def test_the_full_layers_keep_the_causal_cost():
    """The full-attention layers of the same model: FLOPs halved by the causal mask,
    2 x 4096 x 4096 x 64 x 128 / 2 = 137,438,953,472, on the causal curve at 4096 keys:
    0.55 x 0.5 x 4096 / 5120 = 0.22; x 1.4 for the exponentials: 388.71 us."""
    assert _sliding_core_s(CAL, sliding=False) == pytest.approx(137_438_953_472 / (2.25e15 * 0.22) * 1.4, rel=1e-9)
