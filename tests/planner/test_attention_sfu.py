"""Blackwell Ultra doubles the SFU exponential rate that bounds the attention softmax (NVIDIA blog
'Inside NVIDIA Blackwell Ultra', datasheets' 'Attention acceleration (SFU EX2)' row): a GPU preset
field, and the attention core's share spent on exponentials rescaled by it (cost/mixers.py
attention_exp_factor). Golden values by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.calibration import Calibration
from meshplan.cost.mixers import attention_exp_factor
from meshplan.cost.step import estimate
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import gpu_preset, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

CAL = Calibration()


@pytest.mark.parametrize(("gpu", "rate"), [
    ("b200", 5e12), ("gb200", 5e12),      # datasheets: 5 TeraExponentials/s
    ("b300", 10.7e12), ("gb300", 10.7e12),  # Blackwell Ultra: 10.7
    ("h100-sxm", 0.0),                    # no published figure: unknown
])
def test_sfu_rate_golden(gpu, rate):
    assert gpu_preset(gpu).sfu_exp_per_s == rate


def test_exp_factor_golden():
    # forward, head dim 128: 1 - 0.40 + 0.40 x 5 / 10.7 = 0.6 + 0.186916 = 0.786916
    assert attention_exp_factor(CAL, 10.7e12, 128.0) == pytest.approx(0.786916, abs=1e-6)
    # backward: 1 - 0.21 + 0.21 x 5 / 10.7 = 0.79 + 0.098131 = 0.888131
    assert attention_exp_factor(CAL, 10.7e12, 128.0, backward=True) == pytest.approx(0.888131, abs=1e-6)
    # at the reference rate and head dim, or with an unknown rate, nothing changes
    assert attention_exp_factor(CAL, 5e12, 128.0) == 1.0
    assert attention_exp_factor(CAL, 0.0, 64.0, backward=True) == 1.0


def test_a_smaller_head_dim_has_more_exponentials_per_mma_flop():
    # GPT-OSS head dim 64 on B200: 1 - 0.40 + 0.40 x 2 = 1.4 forward, 0.79 + 0.42 = 1.21 backward
    assert attention_exp_factor(CAL, 5e12, 64.0) == pytest.approx(1.4)
    assert attention_exp_factor(CAL, 5e12, 64.0, backward=True) == pytest.approx(1.21)
    # on GB300 the doubled SFU rate takes back most of it: 0.6 + 0.8 x 5 / 10.7 = 0.973832
    assert attention_exp_factor(CAL, 10.7e12, 64.0) == pytest.approx(0.973832, abs=1e-6)
    # DeepSeek-V3's MLA, (192 + 128) / 2 = 160: 0.6 + 0.4 x 0.8 = 0.92
    assert attention_exp_factor(CAL, 5e12, 160.0) == pytest.approx(0.92)


def test_the_derived_shares_follow_the_blogs_speedup():
    """s = 2 (1 - 1/1.35) = 0.52 for fp8 MLA (640 FLOPs per score at the fp8 rate); a bf16
    head-dim-128 kernel's MMA time is 1.6x that, forward 0.52 / (0.48 x 1.6 + 0.52), backward with
    2.5x the forward's MMA FLOPs."""
    s = 2.0 * (1.0 - 1.0 / 1.35)
    mma = (1.0 - s) * (512.0 / 2.0) / (640.0 / 4.0) / 1.0  # bf16 512 at rate 2 vs fp8 640 at rate 4
    assert CAL.attention_exp_share == pytest.approx(s / (mma + s), abs=0.01)
    assert CAL.attention_backward_exp_share == pytest.approx(s / (2.5 * mma + s), abs=0.01)


def test_gb300_attention_is_faster_than_gb200_at_equal_peaks_only_through_the_sfu():
    """Llama-3 70B at 8k on 64 GPUs of a GB300 rack vs the same rack with GB200's SFU rate: the compute
    term drops by the attention core's exp share, and nothing else moves."""
    model = model_preset("llama3-70b")
    rack = system_preset("gb300-nvl72", num_nodes=16)  # 64 GPUs in trays of 4
    slow_sfu = replace(rack, gpu=replace(rack.gpu, sfu_exp_per_s=5e12))
    training = TrainingSpec(seq_len=8192, global_batch=64)
    plan = Plan(dims=ParallelDims(tp=4, pp=2, dp_shard=8), zero=1)
    fast = estimate(model, rack, training, plan, CAL)
    slow = estimate(model, slow_sfu, training, plan, CAL)
    assert fast.time.compute_s < slow.time.compute_s
    assert fast.time.exposed_communication_s == pytest.approx(slow.time.exposed_communication_s, rel=1e-9)
    # the core is at most (1 - 0.786916) of the compute: a bounded gain
    assert fast.time.compute_s > (1.0 - (1.0 - 0.786916)) * slow.time.compute_s


@pytest.mark.parametrize("field", ["attention_exp_share", "attention_backward_exp_share"])
def test_a_share_above_one_is_one_clear_error(field):
    with pytest.raises(MeshplanError, match=field):
        CAL.replace_fields(**{field: 1.5})


def test_a_negative_sfu_rate_is_one_clear_error():
    with pytest.raises(MeshplanError, match="sfu_exp_per_s"):
        replace(gpu_preset("gb300"), sfu_exp_per_s=-1.0)
