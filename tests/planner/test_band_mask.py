"""A sliding-window band costed as the causal kernel's tiles it runs (cost/band_mask.py; GPT-OSS's
window of 128 on alternate layers, issue 14). Golden values by hand."""

from __future__ import annotations

import pytest

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.band_mask import ATTENTION_KEY_TILE, band_kernel_keys
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.mixers import mixer_cost
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import Ffn, LayerKind, Mixer
from meshplan.spec.presets import model_preset

CAL = Calibration()


def test_band_kernel_keys_golden():
    assert ATTENTION_KEY_TILE == 128
    assert band_kernel_keys(128, 4096) == 256  # GPT-OSS: its 128 keys and one tile more
    assert band_kernel_keys(3000, 4096) == 3128
    assert band_kernel_keys(4000, 4096) == 4096  # never past the sequence


@pytest.mark.parametrize(("window", "published"), [(511, 171.0 / 558.2), (1023, 276.6 / 558.2)])
def test_the_rule_tracks_cudnns_published_band_times(window, published):
    """cudnn-frontend PR #505: cuDNN's SDPA backward, B1 S4096 H16 D64, causal 558.2 us, window 511
    171.0 us, window 1023 276.6 us. At equal rate the rule's band / causal time is its keys per
    query over the causal kernel's S / 2: 639 / 2048 = 0.312 (published 0.306), 1151 / 2048 = 0.562
    (published 0.496); dense keys at the dense rate (the rule before) would give 0.25 and 0.50 at
    best, and no tile's waste."""
    assert band_kernel_keys(window, 4096) / 2048.0 == pytest.approx(published, rel=0.15)


def _core_s(calib: Calibration, sliding: bool = True) -> float:
    model = model_preset("gpt-oss-120b")
    cluster = system_preset("dgx-b200", num_nodes=1)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=1)])
    kind = LayerKind(mixer=Mixer.ATTENTION, ffn=Ffn.MOE, sliding=sliding)
    mix = mixer_cost(model, cluster, kind, plans, calib, seq_len=4096, peak=2.25e15, hbm=8e12, ab=2.0,
                     gemm_time=gemm_time, core_peak=2.25e15)
    return float(mix.core_s[0])


def test_sliding_layer_core_golden():
    """GPT-OSS-120B sliding layer, 1 x 4096 tokens, 64 heads of 64, window 128, on B200 (bf16 2.25 PF,
    SFU at the reference rate): kernel FLOPs 2 x 4096 x (128 + 128) x 64 x (64 + 64) =
    17,179,869,184; the causal rate at 4096 keys: 0.55 x 64 / (64 + 64) x 4096 / (4096 + 1024) =
    0.22; exponentials at head dim 64: 1.4. 17,179,869,184 / (2.25e15 x 0.22) x 1.4 = 48.590 us."""
    assert _core_s(CAL) == pytest.approx(17_179_869_184 / (2.25e15 * 0.22) * 1.4, rel=1e-9)
    assert _core_s(CAL) == pytest.approx(48.590e-6, rel=1e-4)


def test_the_full_layers_keep_the_causal_cost():
    """The full-attention layers: FLOPs halved by the causal mask, 2 x 4096 x 4096 x 64 x 128 / 2 =
    137,438,953,472, at the same rate 0.22, x 1.4: 388.71 us; the band is (128 + 128) / 2048 of it."""
    full = _core_s(CAL, sliding=False)
    assert full == pytest.approx(137_438_953_472 / (2.25e15 * 0.22) * 1.4, rel=1e-9)
    assert _core_s(CAL) == pytest.approx(full * 256.0 / 2048.0, rel=1e-9)


def test_the_band_follows_the_causal_curve_not_the_dense_one():
    # moving the dense curve leaves the band alone; moving the causal one moves it:
    # (4096 + 2048) / (4096 + 1024) = 1.2x
    assert _core_s(CAL.replace_fields(attention_half_seq=4096.0)) == pytest.approx(_core_s(CAL), rel=1e-12)
    assert _core_s(CAL.replace_fields(attention_half_seq_causal=2048.0)) == pytest.approx(1.2 * _core_s(CAL), rel=1e-9)
