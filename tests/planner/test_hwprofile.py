"""Hardware profile: load, validate, apply to a cluster, and the alpha-beta / matmul fits.

The golden profile (data/hwprofile_small.json) is built by hand so every figure below follows
from it with pencil and paper: all-reduce over 2 ranks (bus factor 1) of 1 MB in 2 ms and 2 MB
in 3 ms, all-gather over 4 ranks (bus factor 3/4) of 4 MB in 4 ms -> alpha 1 ms, W 1 GB/s; matmul
efficiencies 0.5, 0.75, 0.9 at smallest dims 100, 300, 900 -> eff_max 1, d_half 100.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import system_preset
from meshplan.calib.hwfit import CollectiveOp, bus_factor, fit_alpha_beta, fit_matmul_curve
from meshplan.calib.hwprofile import apply_profile_data, host_share, joint_link_fit, load_profile
from meshplan.calib.hwcalib import profile_fit
from meshplan.spec.training import Precision

GOLDEN = Path(__file__).parent / "data" / "hwprofile_small.json"
SRC = Path(__file__).resolve().parents[2] / "src"


def test_bus_factors_are_the_ring_fractions():
    assert bus_factor(CollectiveOp.ALL_REDUCE, 4) == pytest.approx(1.5)  # 2(n-1)/n
    assert bus_factor(CollectiveOp.ALL_GATHER, 4) == pytest.approx(0.75)  # (n-1)/n
    assert bus_factor(CollectiveOp.REDUCE_SCATTER, 8) == pytest.approx(7 / 8)
    assert bus_factor(CollectiveOp.ALL_TO_ALL, 2) == pytest.approx(0.5)
    assert bus_factor(CollectiveOp.SEND_RECV, 2) == 1.0
    with pytest.raises(MeshplanError):
        bus_factor(CollectiveOp.ALL_REDUCE, 1)


@given(alpha=st.floats(1e-6, 1e-2), bw=st.floats(1e8, 1e12),
       sizes=st.lists(st.integers(1_000, 10**9), min_size=3, max_size=8, unique=True))
def test_alpha_beta_fit_recovers_exact_lines(alpha, bw, sizes):
    times = [alpha + s / bw for s in sizes]
    fit = fit_alpha_beta(sizes, times)
    # recovered as far as the samples can tell them apart: every predicted time is right
    for s, t in zip(sizes, times):
        assert fit.time_s(s) == pytest.approx(t, rel=1e-6)
    assert fit.latency_s >= 0 and fit.bandwidth_bytes_per_s > 0


def test_alpha_beta_fit_never_gives_negative_latency():
    # times that grow faster than linearly push an unconstrained intercept below zero
    fit = fit_alpha_beta([1e3, 1e6, 1e7], [1e-7, 1e-3, 2e-2])
    assert fit.latency_s == 0.0 and fit.bandwidth_bytes_per_s > 0
    with pytest.raises(MeshplanError):
        fit_alpha_beta([1e3], [1e-3])


def test_matmul_curve_fit_golden():
    dims = [(100, 100, 100), (300, 300, 300), (900, 900, 900), (4096, 256, 100)]
    curve = fit_matmul_curve(dims, [5e10, 7.5e10, 9e10, 5e10], peak_flops=1e11)
    assert curve.eff_max == pytest.approx(1.0)
    assert curve.d_half == pytest.approx(100.0)
    assert curve.efficiency(200, 5000, 5000) == pytest.approx(200 / 300)


def test_load_golden_profile():
    p = load_profile(GOLDEN)
    assert p.device.name == "Golden CPU"
    assert p.peak_flops == {"fp32": 1e11}
    assert len(p.collectives) == 3 and p.collectives[2].op == "all_gather"
    lat, bw = joint_link_fit(p.collectives)
    assert lat == pytest.approx(1e-3, rel=1e-9) and bw == pytest.approx(1e9, rel=1e-9)
    assert json.loads(json.dumps(p.to_dict())) == json.loads(GOLDEN.read_text())


def test_apply_profile_single_process_takes_measured_figures():
    base = system_preset("cpu").with_gpus(1)
    c = apply_profile_data(base, load_profile(GOLDEN))
    assert c.gpu.peak_fp32_flops == 1e11
    assert c.gpu.peak_bf16_flops == base.gpu.peak_bf16_flops  # not measured: preset kept
    assert c.gpu.memory_gib == 16.0
    assert c.gpu.hbm_bandwidth_bytes_per_s == 1e10
    assert c.intra_node_latency_s == pytest.approx(1e-3)
    assert c.intra_node_bandwidth_bytes_per_s == pytest.approx(1e9)
    assert c.inter_node_bandwidth_bytes_per_s == base.inter_node_bandwidth_bytes_per_s


@pytest.mark.parametrize("procs, compute, memory", [(1, 1.0, 1.0), (2, 0.5, 0.5), (4, 0.2, 0.25), (8, 0.1, 0.125)])
def test_cpu_processes_share_the_host(procs, compute, memory):
    # probe: 7.5e10 alone (the 300^3 single-process figure), 3.75e10 each with 2, 1.5e10 each with 4;
    # 8 processes (not measured) time-slice the 4-process share once more.
    share = host_share(load_profile(GOLDEN), procs)
    assert share.compute == pytest.approx(compute) and share.memory == pytest.approx(memory)
    c = apply_profile_data(system_preset("cpu").with_gpus(procs), load_profile(GOLDEN))
    assert c.gpu.peak_fp32_flops == pytest.approx(1e11 * compute)
    assert c.gpu.memory_gib == pytest.approx(16.0 * memory)


def test_profile_without_collectives_keeps_the_preset_link(tmp_path):
    data = json.loads(GOLDEN.read_text())
    data.update(collectives=[], collective_fits=[], concurrent=[], link_latency_s=None,
                link_bandwidth_bytes_per_s=None)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    base = system_preset("cpu")
    c = apply_profile_data(base, load_profile(path))
    assert c.intra_node_bandwidth_bytes_per_s == base.intra_node_bandwidth_bytes_per_s
    assert c.gpu.peak_fp32_flops == 1e11


def _broken(tmp_path, edit):
    data = json.loads(GOLDEN.read_text())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(format="other"), "not a meshplan hardware profile"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.pop("matmul"), "lacks matmul"),
    (lambda d: d["device"].update(memory_gib=-1), "device.memory_gib"),
    (lambda d: d["matmul"][0].update(m="big"), "matmul[0].m"),
    (lambda d: d["collectives"][0].update(op="broadcast"), "collectives[0].op"),
    (lambda d: d["collectives"][0].update(group_size=1), "group_size"),
    (lambda d: d["peak_flops"].update(fp64=1.0), "unknown precision"),
    (lambda d: d["meta"].update(extra=1), "unknown field"),
    (lambda d: d.update(link_latency_s=None), "go together"),
])
def test_bad_profiles_name_the_problem(tmp_path, edit, words):
    with pytest.raises(MeshplanError, match="bad.json") as err:
        load_profile(_broken(tmp_path, edit))
    assert words in str(err.value)


def test_not_json_and_missing_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(MeshplanError, match="not valid JSON"):
        load_profile(p)
    with pytest.raises(MeshplanError, match="no such profile"):
        load_profile(tmp_path / "missing.json")


def _cli(*args):
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env)


def test_cli_show_golden_profile():
    out = _cli("profile", "--show", str(GOLDEN), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["device"]["name"] == "Golden CPU"


def test_cli_bad_profile_is_one_line_exit_2(tmp_path):
    path = _broken(tmp_path, lambda d: d["device"].pop("memory_gib"))
    out = _cli("profile", "--show", str(path))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert out.stderr.startswith("error: ") and "device lacks memory_gib" in out.stderr


def test_calibration_fitted_from_golden_profile():
    from meshplan.calib.hwcalib import calibration_from_profile
    from meshplan.spec.training import Precision

    calib, fitted = calibration_from_profile(GOLDEN, Precision.FP32)
    assert calib.matmul_efficiency == pytest.approx(1.0)
    assert calib.matmul_half_dim == pytest.approx(100.0)
    # SDPA 1e10 FLOP/s at H=32, as the cost model uses it: 1e11 * eff * 32 / (32 + 100)
    assert calib.attention_efficiency == pytest.approx(1e10 / (1e11 * 32 / 132))
    assert calib.hbm_efficiency == pytest.approx(0.8)  # add 8 GB/s over best copy 10 GB/s
    assert calib.intra_node_comm_efficiency == 1.0
    assert calib.framework_overhead_gib == pytest.approx(3e8 / 2**30)
    assert calib.attention_half_head_dim == pytest.approx(100.0)  # the matmul curve's
    assert {f.field for f in fitted} == {"matmul_efficiency", "matmul_half_dim", "attention_efficiency",
                                         "attention_half_head_dim",
                                         "hbm_efficiency", "intra_node_comm_efficiency", "framework_overhead_gib",
                                         "all_reduce_latency_factor", "all_reduce_bandwidth_factor",
                                         "tp_overlap", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap",
                                         "pp_p2p_overlap"}
    assert all(f.source == "profile:hwprofile_small.json:2026-11-23T00:00:00Z" for f in fitted)
    assert "profile:hwprofile_small.json" in calib.source
    with pytest.raises(MeshplanError, match="no bf16 matmul"):
        calibration_from_profile(GOLDEN, Precision.BF16)


def test_estimate_with_cluster_profile_uses_measured_rates(tmp_path):
    args = ("estimate", "--model", "toy-gpt", "--cluster", "cpu", "--gpus-per-node", "2", "--seq-len", "64",
            "--global-batch", "8", "--precision", "fp32", "--dp", "2", "--json")
    plain = _cli(*args)
    profiled = _cli(*args, "--cluster-profile", str(GOLDEN))
    assert plain.returncode == 0 and profiled.returncode == 0, plain.stderr + profiled.stderr
    a, b = json.loads(plain.stdout), json.loads(profiled.stdout)
    assert a["step_time_s"] != b["step_time_s"]
    bad = _broken(tmp_path, lambda d: d.update(link_bandwidth_bytes_per_s=-5))
    out = _cli(*args, "--cluster-profile", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "link_bandwidth_bytes_per_s" in out.stderr


def test_profile_without_layer_overhead_loads_with_zero(tmp_path):
    """Profiles written before the layer dispatch overhead was measured still load (0: not fitted)."""
    data = json.loads(GOLDEN.read_text())
    del data["device"]["layer_overhead_s"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert load_profile(old).device.layer_overhead_s == 0.0
    data["device"]["layer_overhead_s"] = 2e-4
    new = tmp_path / "new.json"
    new.write_text(json.dumps(data))
    fitted = {f.field: f.value for f in profile_fit(load_profile(new), "test", Precision.FP32)}
    assert fitted["layer_overhead_s"] == 2e-4


def test_host_per_kernel_applies_to_gpu_profiles_only(tmp_path):
    """The host probe's time per kernel becomes host_s_per_kernel for a CUDA profile (the host
    bound of cost/host.py); on a CPU device dispatch is device time already (layer_overhead_s) and
    the figure stays in the profile only. Profiles written before the probe load with 0."""
    data = json.loads(GOLDEN.read_text())
    del data["device"]["host_s_per_kernel"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert load_profile(old).device.host_s_per_kernel == 0.0
    data["device"]["host_s_per_kernel"] = 7e-6
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps(data))
    assert "host_s_per_kernel" not in {f.field for f in profile_fit(load_profile(cpu), "test", Precision.FP32)}
    data["meta"]["device_type"] = "cuda"
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(data))
    fitted = {f.field: f.value for f in profile_fit(load_profile(gpu), "test", Precision.FP32)}
    assert fitted["host_s_per_kernel"] == 7e-6
    shown = _cli("profile", "--show", str(gpu))
    assert shown.returncode == 0, shown.stderr
    assert "host time per eager kernel" in shown.stdout and "7.0 us" in shown.stdout
