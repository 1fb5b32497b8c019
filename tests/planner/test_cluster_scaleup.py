"""Blackwell presets, the NVLink scale-up domain, NICs per node and the clock limit (issue 13.1)."""

from dataclasses import replace

import pytest

from meshplan.cost import comms, estimate
from meshplan.cost.calibration import Calibration
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import ClusterSpec, cluster_for_gpu, gpu_preset, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec


@pytest.mark.parametrize("name, bf16, fp8, fp4", [
    # dense per-GPU peaks from the datasheets' rack / 8-GPU figures (sparse ones halved)
    ("gb200", 360e15 / 72 / 2, 720e15 / 72 / 2, 1440e15 / 72 / 2),
    ("gb300", 360e15 / 72 / 2, 720e15 / 72 / 2, 1080e15 / 72),
    ("b300", 36e15 / 8 / 2, 72e15 / 8 / 2, 105e15 / 8),
    ("b200", 36e15 / 8 / 2, 72e15 / 8 / 2, 144e15 / 8 / 2),
])
def test_blackwell_peaks_match_datasheets(name, bf16, fp8, fp4):
    g = gpu_preset(name)
    assert g.peak_flops(Precision.BF16) == pytest.approx(bf16)
    assert g.peak_flops(Precision.FP8) == pytest.approx(fp8)
    assert g.peak_flops(Precision.FP4) == pytest.approx(fp4)
    assert g.source and g.hbm_bandwidth_bytes_per_s == 8000e9 and g.nvlink_bandwidth_bytes_per_s == 900e9


def test_every_gpu_preset_names_its_source_or_predates_the_field():
    for name in ("b200", "b300", "gb200", "gb300", "mi325x", "mi355x"):
        assert "datasheet" in gpu_preset(name).source
    with pytest.raises(MeshplanError, match="no fp4 support"):
        gpu_preset("h100-sxm").peak_flops(Precision.FP4)


def test_nvl72_domain_spans_trays():
    rack = system_preset("gb200-nvl72", num_nodes=18)
    assert rack.gpus_per_node == 4 and rack.scale_up_gpus == 72 and rack.num_gpus == 72
    # 4 ConnectX-7 400 Gb/s per 4-GPU tray: 50 GB/s per GPU across racks
    assert rack.inter_node_bandwidth_bytes_per_s == pytest.approx(4 * 50e9 / 4)
    calib = Calibration()
    # a 64-GPU group with 16 trays: NVLink on the rack, NICs on a DGX H100 cluster
    on_rack = comms.group_link(rack, calib, 64, 1)
    assert on_rack.bandwidth_bytes_per_s == pytest.approx(900e9 * calib.intra_node_comm_efficiency)
    dgx = system_preset("dgx-h100", num_nodes=8)
    off = comms.group_link(dgx, calib, 64, 1)
    assert off.bandwidth_bytes_per_s == pytest.approx(50e9 * calib.inter_node_comm_efficiency)
    # beyond the domain: the NICs, with their latency
    two_racks = comms.group_link(rack, calib, 2, 72)
    assert two_racks.bandwidth_bytes_per_s == pytest.approx(50e9 * calib.inter_node_comm_efficiency)
    assert float(two_racks.latency_s) == rack.inter_node_latency_s
    assert system_preset("dgx-h100").scale_up_gpus == 8  # 0: the node is the domain


def test_tp_over_trays_costs_less_on_nvl72_than_on_dgx_with_the_same_gpu():
    """Same GPU and NIC figures; only the domain differs: tp=8 spans two 4-GPU trays."""
    model = model_preset("llama3-70b")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    rack = system_preset("gb200-nvl72", num_nodes=16)
    trays = replace(rack, scale_up_domain_gpus=0)  # the same trays without the NVLink switch
    plan = Plan(dims=ParallelDims(tp=8, pp=2, dp_shard=4), zero=1, sp=True)
    fast, slow = estimate(model, rack, training, plan), estimate(model, trays, training, plan)
    assert fast.step_time_s < slow.step_time_s
    assert fast.time.compute_s == pytest.approx(slow.time.compute_s)


def test_nics_per_node_follow_the_node_size():
    rack = system_preset("gb300-nvl72")
    eight = rack.with_size(gpus_per_node=8)
    assert eight.nics_per_node == 8 and eight.inter_node_bandwidth_bytes_per_s == pytest.approx(100e9)
    # a node of 8 from the GPU name keeps the rack's domain and its NICs per GPU
    c = cluster_for_gpu("gb200", gpus_per_node=8).with_gpus(256)
    assert c.scale_up_gpus == 72 and c.num_nodes == 32 and c.inter_node_bandwidth_bytes_per_s == pytest.approx(50e9)
    with pytest.raises(MeshplanError, match="disagrees"):  # a stale per-GPU figure is refused
        replace(system_preset("gb200-nvl72"), gpus_per_node=8)
    one_nic = replace(system_preset("gb200-nvl72"), nics_per_node=1, inter_node_bandwidth_bytes_per_s=0.0)
    assert one_nic.inter_node_bandwidth_bytes_per_s == pytest.approx(50e9 / 4)
    with pytest.raises(MeshplanError, match="whole number of NICs"):
        one_nic.with_size(gpus_per_node=2)


def test_cluster_file_forms_and_bad_values(tmp_path):
    full = system_preset("gb200-nvl72", num_nodes=2).to_dict()
    assert ClusterSpec.from_dict(full) == system_preset("gb200-nvl72", num_nodes=2)
    old = {k: v for k, v in system_preset("dgx-a100").to_dict().items()
           if k not in ("scale_up_domain_gpus", "nics_per_node", "nic_bandwidth_bytes_per_s", "clock_fraction")}
    old["gpu"] = {k: v for k, v in old["gpu"].items()
                  if k not in ("peak_fp4_flops", "nvlink_bandwidth_bytes_per_s", "block_scaled_recipes", "source")}
    assert ClusterSpec.from_dict(old) == system_preset("dgx-a100")  # files before these fields
    assert ClusterSpec.from_dict({"system": "gb300-nvl72", "clock_fraction": 0.8}).clock_fraction == 0.8
    with pytest.raises(MeshplanError, match="disagrees"):
        ClusterSpec.from_dict({**full, "inter_node_bandwidth_bytes_per_s": 1e9})
    with pytest.raises(MeshplanError, match="clock_fraction"):
        ClusterSpec.from_dict({"system": "dgx-h100", "clock_fraction": 1.5})
    with pytest.raises(MeshplanError, match="smaller than a node"):
        ClusterSpec.from_dict({"system": "dgx-h100", "scale_up_domain_gpus": 4})
    with pytest.raises(MeshplanError, match="nic_bandwidth"):
        ClusterSpec.from_dict({"system": "dgx-a100", "nics_per_node": 8})


def test_clock_fraction_scales_compute_not_bandwidth_nor_mfu_peak():
    model = model_preset("llama3-8b")
    training = TrainingSpec(seq_len=8192, global_batch=8, precision=Precision.FP8)
    full = system_preset("dgx-b300")
    capped = replace(full, clock_fraction=0.75)
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=1)
    a, b = estimate(model, full, training, plan), estimate(model, capped, training, plan)
    assert capped.compute_peak_flops(training) == pytest.approx(0.75 * 4500e12)
    gemm_a = a.time.compute_s
    assert b.time.compute_s > gemm_a * 1.2  # GEMMs dominate an 8B layer: close to 1/0.75
    assert b.time.compute_s < gemm_a / 0.75 * (1 + 1e-9)  # memory-bound ops keep their speed
    assert b.mfu == pytest.approx(a.mfu * a.step_time_s / b.step_time_s)  # same datasheet peak
