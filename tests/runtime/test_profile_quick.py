"""`meshplan profile --quick` measures this machine and writes a profile the planner can load."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshplan.spec.cluster import system_preset
from meshplan.calib.hwprofile import apply_profile_data, load_profile

pytestmark = pytest.mark.runtime
SRC = Path(__file__).resolve().parents[2] / "src"


def test_profile_quick_writes_a_valid_profile(tmp_path):
    out = tmp_path / "profile.json"
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "meshplan", "profile", "--quick", "--procs", "2",
                          "--device", "cpu", "--out", str(out), "--json"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
                         timeout=180)
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == json.loads(out.read_text())
    p = load_profile(out)  # the planner's own validation accepts it
    assert p.meta.device_type == "cpu" and p.meta.backend == "gloo"
    assert 1e8 < p.peak_flops["fp32"] < 1e13  # a CPU core does GFLOP/s, not TFLOP/s of fp32
    assert p.device.hbm_bandwidth_bytes_per_s > 1e8
    assert 5e7 < p.device.framework_baseline_bytes < 4e9  # torch + gloo worker RSS
    assert 1e-7 < p.device.host_s_per_kernel < 1e-3  # eager dispatch + autograd: microseconds per op
    assert {(f.op, f.group_size) for f in p.collective_fits} == {
        ("all_reduce", 2), ("all_gather", 2), ("reduce_scatter", 2), ("all_to_all", 2), ("send_recv", 2),
        ("tp_all_gather", 2), ("tp_reduce_scatter", 2)}
    assert all(f.bandwidth_bytes_per_s > 0 and f.latency_s >= 0 for f in p.collective_fits)
    # larger messages take longer for every op (the sweep measured something real)
    for op in ("all_reduce", "all_gather"):
        times = [s.time_s for s in sorted(p.collectives, key=lambda s: s.message_bytes) if s.op == op]
        assert times[-1] > times[0]
    assert [c.group_size for c in p.concurrent] == [1, 2]
    # the layer probe ran every parallelism through the runtime, and the calibration fits from it
    assert {(r.kind, r.layers) for r in p.layer_probes} == {
        (k, n) for k in ("dp", "fsdp", "tp", "cp") for n in (1, 5)}
    assert all(r.time_s > 0 for r in p.layer_probes)
    from meshplan.calib.hwcalib import calibration_from_profile
    from meshplan.spec.training import Precision

    fitted = {f.field for f in calibration_from_profile(out, Precision.FP32)[1]}
    assert {"tp_layer_overhead_s", "dp_layer_overhead_s", "fsdp_layer_overhead_s", "cp_layer_overhead_s",
            "elementwise_time_factor", "attention_backward_ratio", "attention_backward_half_seq_causal",
            "attention_half_seq_causal"} <= fitted
    # causal SDPA forward and backward over a sweep of S (the lengths of packed documents too)
    assert len({a.seq_len for a in p.attention if a.backward_s > 0}) >= 3
    assert p.device.elementwise_probe_s > 0
    c = apply_profile_data(system_preset("cpu").with_gpus(2), load_profile(out))
    assert c.intra_node_bandwidth_bytes_per_s == p.link_bandwidth_bytes_per_s
    print(f"profile --quick --procs 2 took {elapsed:.1f} s")  # a figure, not a test: see bench/
