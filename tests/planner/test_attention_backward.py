"""The attention core's backward: its ratio to the forward and its own sequence falloff, fitted
from a profile's forward + backward SDPA sweep (calib/hwcalib.py) and used by cost/mixers.py.

Golden profile sweep, built by hand on top of data/hwprofile_small.json (peak 1e11 FLOP/s,
matmul_half_dim 100, so a head dim of 32 runs at rate R = 1e11 * 32 / 132): the forward reaches
0.5 * S / (S + 256) of R and the backward, counted at twice the forward FLOPs, 0.25 * S / (S + 1024)
of R. So attention_efficiency 0.5, attention_half_seq_causal 256, attention_backward_ratio
2 * 0.5 / 0.25 = 4 and attention_backward_half_seq_causal 1024.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan.calib.hwcalib import calibration_from_profile, profile_fit
from meshplan.calib.hwfit import fit_seq_falloff
from meshplan.calib.hwprofile import load_profile
from meshplan.cost import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.layer import layer_cost
from meshplan.cost.mixers import mixer_cost
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.seqlen import from_samples
from meshplan.spec.training import Precision, TrainingSpec

GOLDEN = Path(__file__).parent / "data" / "hwprofile_small.json"
RATE = 1e11 * 32 / 132
SWEEP = (16, 64, 256, 1024, 2048)


def _sample(s: int, heads: int = 8, head_dim: int = 32) -> dict:
    flops = 2 * 2.0 * heads * s * s * head_dim / 2
    fwd = flops / (RATE * 0.5 * s / (s + 256))
    bwd = 2.0 * flops / (RATE * 0.25 * s / (s + 1024))
    return dict(precision="fp32", batch=1, heads=heads, seq_len=s, head_dim=head_dim, time_s=fwd,
                flops_per_s=flops / fwd, backward_s=bwd)


def _sweep_profile(tmp_path: Path, samples) -> Path:
    data = json.loads(GOLDEN.read_text())
    data["attention"] = list(samples)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(data))
    return path


def test_sweep_fit_golden(tmp_path):
    calib, fitted = calibration_from_profile(_sweep_profile(tmp_path, map(_sample, SWEEP)), Precision.FP32)
    assert calib.attention_efficiency == pytest.approx(0.5)
    assert calib.attention_half_seq_causal == pytest.approx(256.0)
    assert calib.attention_backward_ratio == pytest.approx(4.0)
    assert calib.attention_backward_half_seq_causal == pytest.approx(1024.0)
    names = {f.field for f in fitted}
    assert {"attention_backward_ratio", "attention_backward_half_seq_causal", "attention_half_seq_causal"} <= names
    assert all(f.source == "profile:sweep.json:2026-11-23T00:00:00Z" for f in fitted)


def test_old_profile_keeps_the_default_backward(tmp_path):
    """The golden profile's single forward sample (no backward): the median fit, defaults kept."""
    fitted = {f.field for f in profile_fit(load_profile(GOLDEN), "test", Precision.FP32)}
    assert "attention_efficiency" in fitted
    assert not {"attention_backward_ratio", "attention_half_seq_causal"} & fitted
    old = json.loads(GOLDEN.read_text())
    del old["attention"][0]["backward_s"]  # profiles written before the backward was timed
    assert load_profile(_sweep_profile(tmp_path, old["attention"])).attention[0].backward_s == 0.0
    # two lengths with a backward are too few to fit two curves of two parameters each
    two = _sweep_profile(tmp_path, [_sample(256), _sample(1024)])
    assert "attention_backward_ratio" not in {f.field for f in profile_fit(load_profile(two), "t", Precision.FP32)}


def test_negative_backward_is_rejected(tmp_path):
    bad = _sample(256)
    bad["backward_s"] = -1.0
    with pytest.raises(MeshplanError, match=r"attention\[0\].backward_s must be a finite non-negative"):
        load_profile(_sweep_profile(tmp_path, [bad]))


def test_falloff_fit_recovers_exact_curves_and_weights_by_time():
    s = np.array([16, 64, 256, 1024, 4096])
    fit = fit_seq_falloff(s, 0.8 * s / (s + 300.0))
    assert fit.eff_max == pytest.approx(0.8) and fit.d_half == pytest.approx(300.0)
    assert fit.max_rel_error == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(MeshplanError, match="at least two lengths"):
        fit_seq_falloff([256], [0.5])


# ---- the cost model -----------------------------------------------------------------------------

H100 = system_preset("dgx-h100", 2)
MODEL = model_preset("llama3-8b")
KIND = layer_kind_counts(MODEL)[0][0]
KW = dict(peak=1e15, hbm=3e12, ab=2.0, gemm_time=gemm_time)


def _arrays(*plans):
    return PlanArrays.from_plans([p.with_defaults(MODEL) for p in plans])


PLANS = _arrays(Plan(dims=ParallelDims(dp_shard=8), zero=1), Plan(dims=ParallelDims(dp_shard=2, tp=2, cp=2), zero=1, sp=True,
                                                            cp_method=CPMethod.RING))


def test_default_backward_is_exactly_twice_the_forward():
    training = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16)
    cost = layer_cost(MODEL, H100, training, PLANS, Calibration())
    np.testing.assert_array_equal(cost.bwd_compute_s, 2.0 * cost.fwd_compute_s)
    mix = mixer_cost(MODEL, H100, KIND, PLANS, Calibration(), seq_len=4096, **KW)
    np.testing.assert_array_equal(mix.core_bwd_s, 2.0 * mix.core_s)


def test_backward_ratio_and_falloff_change_the_attention_time_as_the_formula_says():
    """t_bwd = ratio * t_fwd * (s + h_bwd) / (s + h_fwd), s the KV length of one call (S; S/c per
    ring step): ratio 3, h_bwd 4096, h_fwd 1024 (causal default), S = 4096:
    3 * (4096 + 4096) / (4096 + 1024) = 4.8 without CP; 3 * 6144 / 3072 = 6 with ring cp=2."""
    calib = Calibration(attention_backward_ratio=3.0, attention_backward_half_seq_causal=4096.0)
    mix = mixer_cost(MODEL, H100, KIND, PLANS, calib, seq_len=4096, **KW)
    np.testing.assert_allclose(mix.core_bwd_s / mix.core_s, [4.8, 6.0])
    base = mixer_cost(MODEL, H100, KIND, PLANS, Calibration(), seq_len=4096, **KW)
    np.testing.assert_array_equal(mix.core_s, base.core_s)  # the forward is unchanged
    training = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16)
    cost = layer_cost(MODEL, H100, training, PLANS, calib)
    # only the core's backward moves: bwd = 2 fwd + (t_bwd - 2 t_fwd), t_fwd the core forward that
    # selective recompute repeats (fused attention: no softmax pass)
    t_fwd = cost.recompute_selective_s
    np.testing.assert_allclose(cost.bwd_compute_s - 2.0 * cost.fwd_compute_s, t_fwd * np.array([2.8, 4.0]))


def test_packed_documents_use_the_backward_falloff():
    """Backward core time at h_bwd = 4096 over h_bwd = 1024 (= h_fwd), both at ratio 3: on full
    sequences (4096 + 4096) / (4096 + 1024) = 1.6; on short documents larger (each document's call
    sits lower on the backward's curve)."""
    docs = from_samples(np.array([64] * 64 + [4096] * 2), source="t.csv")
    plans = _arrays(Plan(dims=ParallelDims(dp_shard=8), zero=1))
    same = Calibration(attention_backward_ratio=3.0)
    slower = same.replace_fields(attention_backward_half_seq_causal=4096.0)

    def extra_s(calib, dist):
        """bwd - 2 fwd: the core's backward less twice its forward (the forward does not move)."""
        tr = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16, seq_len_dist=dist)
        cost = layer_cost(MODEL, H100, tr, plans, calib)
        return float((cost.bwd_compute_s - 2.0 * cost.fwd_compute_s)[0])

    def backward_growth(dist):
        t_fwd = extra_s(same, dist)  # (3 - 2) x the core forward
        return (extra_s(slower, dist) + 2.0 * t_fwd) / (3.0 * t_fwd)

    assert backward_growth(None) == pytest.approx(1.6)
    assert backward_growth(docs) > 1.6
