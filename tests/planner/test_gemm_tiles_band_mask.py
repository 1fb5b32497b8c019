"""Two kernel mechanisms that GPT-OSS's shapes expose on Blackwell (issue 14): GEMM tile
quantization along the MMA's M dimension (cost/gemm_tiles.py; hidden and expert width 2880 is
11.25 tiles of 256) and a sliding-window band costed as the causal kernel it runs like
(cost/band_mask.py). Golden values by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.band_mask import band_equivalent_causal_keys
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.gemm_tiles import linear_tile_factor, tile_fill
from meshplan.cost.mixers import mixer_cost
from meshplan.cost.step import estimate
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import gpu_preset, system_preset
from meshplan.spec.layers import LayerKind, Mixer, Ffn
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

CAL = Calibration()


# ---- tile quantization ------------------------------------------------------------------------

def test_tile_fill_golden():
    assert tile_fill(2880, 256) == pytest.approx(2880 / 3072)  # 11.25 tiles -> 12: 0.9375
    assert tile_fill(2880, 256) == pytest.approx(0.9375)
    assert tile_fill(5760, 256) == pytest.approx(5760 / 5888)  # 22.5 -> 23: 0.978261
    assert tile_fill(5120, 256) == 1.0  # GPT-OSS QKV: 64 x 64 + 2 x 8 x 64 = 20 tiles
    assert tile_fill(8192, 256) == 1.0
    assert tile_fill(2880, 0) == 1.0  # unknown tile: no quantization


def test_linear_tile_factor_golden():
    # expert down projection, weight 2880 x 2880: every pass 1 / 0.9375 = 1.066667
    assert linear_tile_factor(256, 2880, 2880) == pytest.approx(1.0666667, abs=1e-6)
    # expert up projection (gate + up), weight 5760 x 2880: the forward 1/3 x 5888/5760 = 0.340741,
    # the two backward passes 2/3 x 3072/2880 = 0.711111: 1.051852
    assert linear_tile_factor(256, 5760, 2880) == pytest.approx(1.051852, abs=1e-6)
    # attention output projection, weight 2880 x 4096: 1/3 x 1.066667 + 2/3 x 1 = 1.022222
    assert linear_tile_factor(256, 2880, 4096) == pytest.approx(1.022222, abs=1e-6)
    # Llama-3 8B's MLP, 14336 x 4096 (56 and 16 tiles): untouched
    assert linear_tile_factor(256, 14336, 4096) == 1.0
    assert linear_tile_factor(0, 2880, 2880) == 1.0


@pytest.mark.parametrize(("gpu", "tile"), [
    ("b200", 256), ("gb200", 256), ("b300", 256), ("gb300", 256),  # tcgen05 cta_group::2: M = 2 x 128
    ("h100-sxm", 0), ("h200", 0),                                  # no figure given: unknown
])
def test_mma_tile_preset_golden(gpu, tile):
    assert gpu_preset(gpu).mma_tile_m == tile


def test_a_negative_tile_is_one_clear_error():
    with pytest.raises(MeshplanError, match="mma_tile_m"):
        replace(gpu_preset("b200"), mma_tile_m=-256)


def _step_s(model_name: str, gpu_tile: int) -> float:
    cluster = system_preset("dgx-b200", num_nodes=1)
    cluster = replace(cluster, gpu=replace(cluster.gpu, mma_tile_m=gpu_tile))
    training = TrainingSpec(seq_len=4096, global_batch=8)
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=1)
    return estimate(model_preset(model_name), cluster, training, plan, CAL).step_time_s


def test_tiles_slow_only_a_model_whose_widths_miss_the_tile():
    # Llama-3 8B: 4096, 1024, 14336 are whole tiles of 256: the same step
    assert _step_s("llama3-8b", 256) == pytest.approx(_step_s("llama3-8b", 0), rel=1e-12)
    # GPT-OSS-20B: hidden and expert width 2880: slower, by less than the worst pass (6.7%)
    with_tiles, without = _step_s("gpt-oss-20b", 256), _step_s("gpt-oss-20b", 0)
    assert without < with_tiles < 1.0667 * without


# ---- sliding-window band ----------------------------------------------------------------------

def test_band_equivalent_causal_keys_golden():
    assert band_equivalent_causal_keys(128, 4096) == 256  # GPT-OSS: a causal kernel over 256 keys
    assert band_equivalent_causal_keys(3000, 4096) == 4096  # 2w past the sequence: the sequence
    assert band_equivalent_causal_keys(128, 200) == 200


def _sliding_core_s(calib: Calibration) -> float:
    model = model_preset("gpt-oss-120b")
    cluster = system_preset("dgx-b200", num_nodes=1)
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=1)])
    kind = LayerKind(mixer=Mixer.ATTENTION, ffn=Ffn.MOE, sliding=True)
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
