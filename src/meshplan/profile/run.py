"""The whole profile: compute sweeps on device 0, collectives over N processes, fits, JSON."""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import dataclass
from typing import Callable

import torch

from meshplan.profile import collectives as coll
from meshplan.profile import layer_probe
from meshplan.profile.compute import (bench_attention, bench_bandwidth, bench_elementwise, bench_host_per_kernel,
                                      bench_layer_overhead,
                                      bench_matmuls, device_memory_bytes, device_name, sweep_plan)
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GIB
from meshplan.calib.hwfit import CollectiveOp, bus_factor, fit_alpha_beta
from meshplan.calib.hwprofile import (CollectiveFit, DeviceFigures, HardwareProfile, ProfileMeta,
                                     joint_link_fit)


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    procs: int
    quick: bool
    device_type: str
    """"cpu" or "cuda"; "auto" picks cuda when available."""


def default_procs(device_type: str) -> int:
    if device_type == "cuda":
        return torch.cuda.device_count()
    return 4


def resolve_device_type(name: str) -> str:
    """'auto' -> cuda when visible, else cpu; an explicit 'cuda' without a device is refused."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise MeshplanError("--device cuda but no CUDA device is visible")
    return name


def planned_steps(req: ProfileRequest) -> int:
    """Progress-bar total: one step per measured shape plus one per collective (op, group)."""
    device = torch.device(req.device_type)
    plan = sweep_plan(device, req.quick)
    n = len(plan.precisions) * len(plan.matmul_shapes)
    n += sum(1 if p == "fp8" else len(plan.attention_shapes) for p in plan.precisions)
    n += 2 * len(plan.bandwidth_bytes) + 3  # + the layer dispatch overhead, the elementwise and host probes
    if req.procs >= 2:
        n += coll.progress_steps(coll.collective_config(req.procs, req.device_type, req.quick))
        if req.device_type == "cpu":
            n += layer_probe.progress_steps()
    return n


def run_profile(req: ProfileRequest, advance: Callable[[str], None]) -> HardwareProfile:
    """Measure everything; ``advance(label)`` is called after each step (for a progress bar)."""
    device = torch.device(req.device_type, 0) if req.device_type == "cuda" else torch.device("cpu")
    plan = sweep_plan(device, req.quick)
    if device.type == "cpu":
        # one intra-op thread, as each CPU rank of `meshplan train` (and of torchrun) has; several
        # OpenMP threads on a shared host also stall whenever one of them loses its core
        torch.set_num_threads(coll.CPU_THREADS_PER_PROC)
    matmul = []
    for precision in plan.precisions:
        matmul += bench_matmuls(device, precision, plan.matmul_shapes, plan.budget_s, advance=advance)
    attention = []
    for precision in plan.precisions:
        if precision == "fp8":  # no fp8 SDPA kernel to measure
            advance("attention fp8 (skipped)")
            continue
        for b, h, s, d in plan.attention_shapes:
            attention.append(bench_attention(device, precision, b, h, s, d, plan.budget_s))
            advance(f"attention {precision} S={s}")
    bandwidth = []
    for nbytes in plan.bandwidth_bytes:
        for op in ("copy", "add"):
            bandwidth.append(bench_bandwidth(device, op, nbytes, plan.budget_s))
            advance(f"{op} {nbytes >> 20} MiB")
    layer_overhead = bench_layer_overhead(device, plan.budget_s)
    advance("layer dispatch overhead")
    elementwise = bench_elementwise(device, plan.budget_s)
    advance("elementwise ops of a layer")
    host_per_kernel = bench_host_per_kernel(device, plan.budget_s)
    advance("host time per kernel")
    samples, concurrent, fits, probes = (), (), (), ()
    link_latency, link_bw = None, None
    baseline = _own_rss_bytes()
    if req.procs >= 2:
        res = coll.run_collectives(coll.collective_config(req.procs, req.device_type, req.quick), advance)
        samples, concurrent, baseline = res.samples, res.concurrent, res.framework_baseline_bytes
        fits = _fit_collectives(samples)
        link_latency, link_bw = joint_link_fit(samples)
        if device.type == "cpu":  # on a GPU the host's per-layer time hides behind the device's
            probes = layer_probe.run_layer_probes(plan.budget_s * 2, advance)
    peaks: dict[str, float] = {}
    for s in matmul:
        peaks[s.precision] = max(peaks.get(s.precision, 0.0), s.flops_per_s)
    meta = ProfileMeta(
        created_utc=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        host=socket.gethostname(), torch_version=torch.__version__, device_type=req.device_type,
        backend="nccl" if req.device_type == "cuda" else "gloo", num_threads=torch.get_num_threads(),
        cpu_count=_cpu_count(), quick=req.quick,
    )
    figures = DeviceFigures(name=device_name(device), memory_gib=device_memory_bytes(device) / GIB,
                            hbm_bandwidth_bytes_per_s=max(b.bytes_per_s for b in bandwidth),
                            framework_baseline_bytes=baseline, layer_overhead_s=layer_overhead,
                            elementwise_probe_s=elementwise, host_s_per_kernel=host_per_kernel)
    return HardwareProfile(meta=meta, device=figures, peak_flops=peaks, matmul=tuple(matmul),
                           attention=tuple(attention), bandwidth=tuple(bandwidth), concurrent=concurrent,
                           collectives=samples, collective_fits=fits, link_latency_s=link_latency,
                           link_bandwidth_bytes_per_s=link_bw, layer_probes=probes)


def _fit_collectives(samples) -> tuple[CollectiveFit, ...]:
    keys = sorted({(s.op, s.group_size) for s in samples})
    out = []
    for op, g in keys:
        rows = [s for s in samples if s.op == op and s.group_size == g]
        f = bus_factor(CollectiveOp(op), g)
        ab = fit_alpha_beta([f * s.message_bytes for s in rows], [s.time_s for s in rows])
        out.append(CollectiveFit(op=op, group_size=g, latency_s=ab.latency_s,
                                 bandwidth_bytes_per_s=ab.bandwidth_bytes_per_s, max_rel_error=ab.max_rel_error))
    return tuple(out)


def _own_rss_bytes() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
