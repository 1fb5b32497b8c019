"""The runtime-path terms of the cost model and how a profile fits them (no torch).

Golden values by hand on the golden profile (data/hwprofile_small.json: link alpha 1 ms, W 1 GB/s;
an all-reduce fit over 2 ranks of alpha 1 ms, W 1 GB/s; concurrent shares 1, 0.5 and 0.2 for 1, 2
and 4 processes) and on the cost model's own per-layer terms.
"""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshplan.cost import comms, estimate
from meshplan.cost.calibration import Calibration
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.calib.hwcalib import (CPU_SERIAL_OVERLAPS, _probe_model, calibration_from_profile,
                                   calibration_from_profile_data, host_time_scaled)
from meshplan.calib.hwprofile import HardwareProfile, LayerProbeSample, joint_link_fit, load_profile
from meshplan.calib.layer_probe import PROBE_LAYERS, ProbeKind, probe_plan
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

GOLDEN = Path(__file__).parent / "data" / "hwprofile_small.json"


def test_per_op_factors_golden():
    # all-reduce over 2 ranks: alpha 1 ms for 2(n-1) = 2 ring steps -> 0.5 ms a step, over the link's
    # 1 ms -> 0.5; W 1 GB/s over the link's 1 GB/s -> 1. Ops not measured keep 1.
    calib, fitted = calibration_from_profile(GOLDEN, Precision.FP32)
    assert calib.all_reduce_latency_factor == pytest.approx(0.5)
    assert calib.all_reduce_bandwidth_factor == pytest.approx(1.0)
    assert calib.all_gather_latency_factor == 1.0 and calib.tp_reduce_scatter_bandwidth_factor == 1.0
    assert calib.collective_factors("all_reduce") == (pytest.approx(0.5), pytest.approx(1.0))
    # a CPU profile: every core runs a rank, nothing overlaps
    assert all(getattr(calib, name) == 0.0 for name in CPU_SERIAL_OVERLAPS)
    assert {"all_reduce_latency_factor", "tp_overlap", "dp_overlap"} <= {f.field for f in fitted}


def test_link_rates_apply_the_op_factors():
    calib = Calibration(all_gather_latency_factor=2.0, tp_all_gather_bandwidth_factor=0.5)
    link = comms.Link(bandwidth_bytes_per_s=np.array(1e9), latency_s=np.array(1e-3), calib=calib)
    # (n-1)/n * B / W + (n-1) alpha with n = 2, B = 2 MB
    assert comms.all_gather_time(2e6, 2, link) == pytest.approx(1e6 / 1e9 + 2e-3)
    assert comms.all_gather_time(2e6, 2, link, "tp_all_gather") == pytest.approx(1e6 / 0.5e9 + 1e-3)
    assert comms.reduce_scatter_time(2e6, 2, link) == pytest.approx(1e6 / 1e9 + 1e-3)
    with pytest.raises(MeshplanError, match="unknown collective 'broadcast'"):
        calib.collective_factors("broadcast")


def test_joint_link_fit_ignores_the_runtime_path_ops():
    p = load_profile(GOLDEN)
    slow = [replace(s, op="tp_all_gather", time_s=s.time_s * 10) for s in p.collectives]
    assert joint_link_fit(p.collectives + tuple(slow)) == pytest.approx(joint_link_fit(p.collectives))


def _step(plan: Plan, calib: Calibration, layers: int = 4) -> float:
    model = model_preset("toy-llama").with_overrides({"num_layers": layers})
    training = TrainingSpec(seq_len=64, global_batch=8, precision=Precision.FP32)
    cluster = system_preset("cpu").with_gpus(plan.dims.world_size)
    return estimate(model, cluster, training, plan.with_defaults(model), calib).step_time_s


@pytest.mark.parametrize("plan, field, charged", [
    # per layer x micro-batch x (group - 1): 4 layers, 8 rows / mb 2 = 4 micro-batches
    (Plan(dims=ParallelDims(tp=2), sp=True, micro_batch=2), "tp_layer_overhead_s", 4 * 4 * 1),
    (Plan(dims=ParallelDims(tp=4), sp=True, micro_batch=2), "tp_layer_overhead_s", 4 * 4 * 3),
    (Plan(dims=ParallelDims(cp=2), cp_method=CPMethod.ALL_TO_ALL, micro_batch=2), "cp_layer_overhead_s", 4 * 4 * 1),
    (Plan(dims=ParallelDims(cp=2), cp_method=CPMethod.RING, micro_batch=2), "cp_layer_overhead_s", 4 * 4 * 1),
    # ZeRO-3 over 2: 8 rows / dp 2 / mb 2 = 2 micro-batches
    (Plan(dims=ParallelDims(dp_shard=2), zero=3, micro_batch=2), "fsdp_layer_overhead_s", 4 * 2 * 1),
    # zero 0 over 4 ranks: once per step and layer, whatever the micro-batches
    (Plan(dims=ParallelDims(dp_replicate=4), micro_batch=1), "dp_layer_overhead_s", 4 * 1 * 3),
])
def test_runtime_overheads_are_charged_per_layer_and_rank(plan, field, charged):
    base = Calibration(tp_overlap=0.0, dp_overlap=0.0, fsdp_overlap=0.0, cp_overlap=0.0)
    extra = _step(plan, base.replace_fields(**{field: 0.01})) - _step(plan, base)
    assert extra == pytest.approx(0.01 * charged, rel=1e-9)


def test_no_runtime_overhead_without_the_parallelism():
    calib = Calibration(tp_layer_overhead_s=1.0, cp_layer_overhead_s=1.0, fsdp_layer_overhead_s=1.0,
                        dp_layer_overhead_s=1.0)
    plan = Plan(micro_batch=2)
    assert _step(plan, calib) == pytest.approx(_step(plan, Calibration()))
    zero1 = Plan(dims=ParallelDims(dp_shard=2), zero=1, micro_batch=2)  # fsdp term is ZeRO-2/3 only
    assert _step(zero1, calib.replace_fields(fsdp_layer_overhead_s=0.0)) == pytest.approx(_step(zero1, calib))


def test_host_time_scales_with_the_share_of_the_cores():
    # golden shares: 1 process 1.0, 2 processes 0.5, 4 processes 0.2 (of the single-process probe)
    profile = load_profile(GOLDEN)
    calib = Calibration(layer_overhead_s=1e-3, tp_layer_overhead_s=1e-2)
    four = host_time_scaled(calib, profile, 4)
    assert four.layer_overhead_s == pytest.approx(1e-3 * 1.0 / 0.2)  # measured on one process
    assert four.tp_layer_overhead_s == pytest.approx(1e-2 * 0.5 / 0.2)  # measured on two
    assert host_time_scaled(calib, profile, 2).tp_layer_overhead_s == pytest.approx(1e-2)
    gpu = replace(profile, meta=replace(profile.meta, device_type="cuda"))
    assert host_time_scaled(calib, gpu, 4) == calib


def _with_probes(profile: HardwareProfile, calib: Calibration, extra_s: dict[ProbeKind, float]) -> HardwareProfile:
    """Probe samples whose time per extra layer is the model's plus ``extra_s`` (fitted in order)."""
    rows = []
    few, many = PROBE_LAYERS
    for kind in ProbeKind:
        modeled, _ = _probe_model(profile, kind, 2, calib)
        per_layer = modeled + extra_s.get(kind, 0.0)
        rows += [LayerProbeSample(kind=kind.value, group_size=2, layers=few, time_s=0.05),
                 LayerProbeSample(kind=kind.value, group_size=2, layers=many, time_s=0.05 + (many - few) * per_layer)]
        calib = calib.replace_fields(**{kind.overhead_field: max(0.0, extra_s.get(kind, 0.0))})
    return replace(profile, layer_probes=tuple(rows))


def test_probe_fit_recovers_the_overheads_it_was_built_with():
    golden = load_profile(GOLDEN)
    base, _ = calibration_from_profile_data(golden, "t", Precision.FP32)
    extra = {ProbeKind.DP: 2e-3, ProbeKind.FSDP: 5e-3, ProbeKind.TP: 1e-2, ProbeKind.CP: 4e-3}
    calib, fitted = calibration_from_profile_data(_with_probes(golden, base, extra), "t", Precision.FP32)
    for kind, value in extra.items():
        assert getattr(calib, kind.overhead_field) == pytest.approx(value, rel=1e-6, abs=1e-12)
    assert any("layer probe over 2 processes" in f.how for f in fitted)
    # a probe the formulas explain fully fits to 0, never below
    calib0, _ = calibration_from_profile_data(_with_probes(golden, base, {ProbeKind.TP: -5e-3}), "t", Precision.FP32)
    assert calib0.tp_layer_overhead_s == 0.0


def test_probe_plans_are_the_parallelism_alone():
    assert probe_plan(ProbeKind.TP).dims == ParallelDims(tp=2)
    assert probe_plan(ProbeKind.FSDP).zero == 3 and probe_plan(ProbeKind.FSDP).dims == ParallelDims(dp_shard=2)
    assert probe_plan(ProbeKind.CP).cp_method == CPMethod.ALL_TO_ALL


def test_profiles_without_probes_load_and_bad_probes_are_named(tmp_path):
    data = json.loads(GOLDEN.read_text())
    data.pop("layer_probes", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert load_profile(old).layer_probes == ()
    data["layer_probes"] = [{"kind": "pp", "group_size": 2, "layers": 1, "time_s": 0.1}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(MeshplanError, match=r"layer_probes\[0\]\.kind 'pp'"):
        load_profile(bad)


def test_elementwise_factor_scales_the_memory_bound_time_only():
    from meshplan.cost.arrays import PlanArrays
    from meshplan.cost.layer import layer_cost

    model = model_preset("toy-llama")
    training = TrainingSpec(seq_len=64, global_batch=8, precision=Precision.FP32)
    cluster = system_preset("cpu").with_gpus(1)
    plans = PlanArrays.from_plans([Plan(micro_batch=2).with_defaults(model)])
    f0, f1, f3 = (layer_cost(model, cluster, training, plans, Calibration(elementwise_time_factor=f)).fwd_compute_s[0]
                  for f in (0.0, 1.0, 3.0))
    # fwd = math + memory-bound * factor: linear in the factor, and the memory-bound part is the
    # bytes of 2 norms (r+w), 2 residual adds (2r+w) and SwiGLU (3 F-wide tensors) over W_hbm * eff
    assert f3 - f0 == pytest.approx(3.0 * (f1 - f0))
    T, D, F = 2 * 64, model.hidden_size, model.ffn_hidden_size
    bytes_moved = (T * D * 10 + T * F * 3) * 4
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s * Calibration().hbm_efficiency
    assert f1 - f0 == pytest.approx(bytes_moved / hbm)


def test_elementwise_probe_fits_the_factor():
    from meshplan.calib.hwcalib import _elementwise_fit

    golden = load_profile(GOLDEN)
    assert "elementwise_time_factor" not in {f.field for f in calibration_from_profile(GOLDEN, Precision.FP32)[1]}
    base = _elementwise_fit(replace(golden, device=replace(golden.device, elementwise_probe_s=1.0)), "t",
                            0.8)
    modeled = 1.0 / base.value  # what the formulas give for the probe layer
    probe = replace(golden, device=replace(golden.device, elementwise_probe_s=4.0 * modeled))
    calib, _ = calibration_from_profile_data(probe, "t", Precision.FP32)
    assert calib.elementwise_time_factor == pytest.approx(4.0)
