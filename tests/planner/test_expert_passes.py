"""Golden values of the experts' eager passes (cost/expert_passes.py), derived by hand, and their
place in the MoE block's time (cost/moe.py, cost/layer.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.expert_passes import expert_pass_bytes
from meshplan.cost.layer import layer_cost
from meshplan.plan import ParallelDims, Plan, Recompute, RecomputeModule
from meshplan.spec.cluster import system_preset
from meshplan.spec.hf import load_hf_config
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def _gpt_oss():
    return model_preset("gpt-oss-120b")


def test_gpt_oss_bytes_by_hand():
    # GPT-OSS 120B: D = F = 2880, GLU (fc1 output 2F = 5760), biased experts, clamp 7.0.
    # 1000 routed copies in bf16 (2 B):
    #   bias  fwd 6 x 1000 x 2880 x 2 = 34,560,000 B; bwd 6 x ... = 34,560,000 B
    #   clamp fwd 4 x 1000 x 5760 x 2 = 46,080,000 B; bwd 5 x ... = 57,600,000 B
    b = expert_pass_bytes(_gpt_oss(), copies=1000.0, fc1_width=5760.0, out_width=2880.0, ab=2.0,
                          fused_mlp=False)
    assert float(b.fwd_bytes) == pytest.approx(34_560_000 + 46_080_000)
    assert float(b.bwd_bytes) == pytest.approx(34_560_000 + 57_600_000)


def test_no_passes_without_bias_clamp_or_under_a_fused_mlp():
    m = _gpt_oss()
    kw = dict(copies=1000.0, fc1_width=5760.0, out_width=2880.0, ab=2.0)
    assert float(expert_pass_bytes(m, fused_mlp=True, **kw).fwd_bytes) == 0.0
    plain = replace(m, mlp_bias=False, glu_clamp_limit=0.0)
    assert float(expert_pass_bytes(plain, fused_mlp=False, **kw).bwd_bytes) == 0.0
    only_bias = replace(m, glu_clamp_limit=0.0)
    assert float(expert_pass_bytes(only_bias, fused_mlp=False, **kw).fwd_bytes) == pytest.approx(34_560_000)


def test_layer_time_grows_by_the_passes_over_hbm():
    # One MoE layer of GPT-OSS 120B on 8 H100s, ep 8, mb 1 x 4096 tokens, bf16, no bias/clamp vs
    # both: the forward grows by fwd_bytes / (W_hbm x hbm_efficiency) x elementwise factor and the
    # backward by bwd_bytes / the same rate (force-balanced routing: 4096 x 4 copies over 8 ranks).
    model = _gpt_oss()
    plain = replace(model, mlp_bias=False, glu_clamp_limit=0.0)
    cluster = system_preset("dgx-h100", 1)
    training = TrainingSpec(seq_len=4096, global_batch=8, precision="bf16")
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), micro_batch=1, zero=1).with_defaults(model)
    calib = calibration_for(cluster.gpu)
    arrays = PlanArrays.from_plans([plan])
    with_passes = layer_cost(model, cluster, training, arrays, calib)
    without = layer_cost(plain, cluster, training, arrays, calib)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency / calib.elementwise_time_factor
    copies = 4096 * 4 * calib.moe_routing_imbalance
    fwd = copies * (6 * 2880 + 4 * 5760) * 2
    bwd = copies * (6 * 2880 + 5 * 5760) * 2
    # the bias's parameters are in both (mlp_bias flips them), but they move no time here
    d_fwd = float(with_passes.fwd_compute_s[0] - without.fwd_compute_s[0])
    d_bwd = float(with_passes.bwd_compute_s[0] - without.bwd_compute_s[0])
    assert d_fwd == pytest.approx(fwd / hbm, rel=1e-6)
    assert d_bwd == pytest.approx(bwd / hbm, rel=1e-6)


def test_hf_import_reads_the_swiglu_limit():
    from pathlib import Path
    cfg = Path(__file__).parent.parent / "fixtures" / "hf" / "gpt-oss-120b"
    assert load_hf_config(cfg).glu_clamp_limit == 7.0
    assert model_preset("gpt-oss-120b").glu_clamp_limit == 7.0
    assert model_preset("qwen3-30b-a3b").glu_clamp_limit == 0.0


def test_moe_act_recompute_reruns_the_clamp():
    # Megatron's moe_act recompute reruns TEGroupedMLP's bias_act_func, clamp and cat included:
    # 8 more elements per element of the F-wide activation (4 over the 2F-wide fc1 output) than
    # the unclamped GLU's 3, per routed copy: T*k/t copies of F = 2880 on each of 8 ranks' share.
    model = _gpt_oss()
    unclamped = replace(model, glu_clamp_limit=0.0)
    cluster = system_preset("dgx-h100", 1)
    training = TrainingSpec(seq_len=4096, global_batch=8, precision="bf16")
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), micro_batch=1, zero=1, recompute=Recompute.SELECTIVE,
                recompute_modules=(RecomputeModule.MOE_ACT,)).with_defaults(model)
    calib = calibration_for(cluster.gpu)
    arrays = PlanArrays.from_plans([plan])
    ew = 2.0 / (cluster.gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency) * calib.elementwise_time_factor
    got = (layer_cost(model, cluster, training, arrays, calib).recompute_selective_s
           - layer_cost(unclamped, cluster, training, arrays, calib).recompute_selective_s)
    assert float(np.ravel(got)[0]) == pytest.approx(4096 * 4 * 2880 * 8 * ew, rel=1e-6)


@pytest.mark.parametrize("value", [[], "7", float("nan"), -1.0, True])
def test_glu_clamp_limit_refuses_what_is_not_a_finite_number(value):
    # the fuzz of Job files found a list here reaching the cost model's caches (unhashable)
    from dataclasses import replace

    from meshplan.errors import MeshplanError
    from meshplan.spec.presets import model_preset

    with pytest.raises(MeshplanError, match="glu_clamp_limit"):
        replace(model_preset("gpt-oss-120b"), glu_clamp_limit=value)
