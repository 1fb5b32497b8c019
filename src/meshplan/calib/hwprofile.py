"""Hardware profile: the JSON that ``meshplan profile`` writes, loaded and applied without torch.

A profile replaces preset (datasheet) figures with measured ones:

* ``apply_profile_data(cluster, profile)``: the GPU's peak FLOP/s for each measured precision (the best
  matmul throughput seen), its memory capacity and memory bandwidth, and the intra-node link
  (alpha-beta fit over every collective sample), so the cost model's ``T = quantity / rate`` uses
  rates of this machine.
* ``meshplan.calib.hwcalib``: the fitted factors a Calibration needs (matmul efficiency curve,
  attention and memory-bound efficiency, framework memory baseline), each with its source
  ``profile:<file>:<date>``, mapped onto the cost model's Calibration.

The format is versioned; a malformed file raises MeshplanError naming the file and the field.
"""

from __future__ import annotations

import logging
import math
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from meshplan.calib.hwfit import CollectiveOp, bus_factor, fit_alpha_beta
from meshplan.errors import MeshplanError
from meshplan.jsonfile import load_json_file
from meshplan.spec.cluster import ClusterSpec

PROFILE_FORMAT = "meshplan-hwprofile"
PROFILE_VERSION = 1
_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ProfileMeta:
    created_utc: str
    host: str
    torch_version: str
    device_type: str
    """"cpu" or "cuda"."""
    backend: str
    """torch.distributed backend of the collective benchmarks (gloo, nccl)."""
    num_threads: int
    """torch intra-op threads of the single-process benchmarks."""
    cpu_count: int
    quick: bool


@dataclass(frozen=True, kw_only=True)
class DeviceFigures:
    name: str
    memory_gib: float
    """Capacity one rank may use: GPU memory, or on CPU the host RAM."""
    hbm_bandwidth_bytes_per_s: float
    """Best memory-bound bandwidth measured (copy or elementwise, bytes read + written)."""
    framework_baseline_bytes: float
    """Resident memory of a torch worker that has joined its process group and done nothing else."""
    layer_overhead_s: float = 0.0
    """Fixed time of one Transformer layer's forward, apart from its FLOPs and bytes: the
    per-layer dispatch cost of the runtime's own model, measured on a layer too small for its
    math to count (0 in profiles written before it was measured)."""
    elementwise_probe_s: float = 0.0
    """Forward + backward of the memory-bound ops of one runtime layer at the elementwise probe's
    shape (meshplan.calib.layer_probe.ELEMENTWISE_PROBE); 0: not measured."""
    host_s_per_kernel: float = 0.0
    """Host time to issue one eager aten op, forward or backward (Python, the dispatcher, autograd
    and on CUDA the launch): a chain of tiny ops whose math is nil (profile.compute
    ``bench_host_per_kernel``); 0: not measured."""


@dataclass(frozen=True, kw_only=True)
class MatmulSample:
    precision: str
    m: int
    n: int
    k: int
    time_s: float
    flops_per_s: float


@dataclass(frozen=True, kw_only=True)
class AttentionSample:
    """Causal scaled_dot_product_attention, forward: 2 matmuls of 2*B*N*S*S*H FLOPs, halved by the
    mask; and its backward (forward + backward less the forward)."""

    precision: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    time_s: float
    flops_per_s: float
    backward_s: float = 0.0
    """Backward time (dQ, dK, dV); 0: not measured (profiles written before it was)."""


@dataclass(frozen=True, kw_only=True)
class BandwidthSample:
    op: str
    """"copy" (read + write) or "add" (two reads + one write)."""
    bytes: int
    time_s: float
    bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class ConcurrentSample:
    """Matmul throughput per process while ``group_size`` processes compute at once (shared cores)."""

    group_size: int
    dim: int
    """Square fp32 (CPU) / bf16 (GPU) matmul size of the probe."""
    flops_per_s_per_process: float


@dataclass(frozen=True, kw_only=True)
class CollectiveSample:
    op: str
    group_size: int
    message_bytes: int
    """Full buffer: all-reduce/all-to-all per-rank tensor, all-gather output, reduce-scatter input."""
    time_s: float


@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    op: str
    group_size: int
    latency_s: float
    bandwidth_bytes_per_s: float
    """Bus bandwidth: bus bytes (bus_factor * message) per second."""
    max_rel_error: float


@dataclass(frozen=True, kw_only=True)
class LayerProbeSample:
    """Forward + backward of the probe model (meshplan.calib.layer_probe) with ``layers`` layers
    through the runtime: "single" on one process, else a ProbeKind over ``group_size`` processes
    (slowest rank)."""

    kind: str
    group_size: int
    layers: int
    time_s: float


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    meta: ProfileMeta
    device: DeviceFigures
    peak_flops: dict[str, float]
    """Best measured matmul FLOP/s per precision ("fp32", "bf16", ...)."""
    matmul: tuple[MatmulSample, ...]
    attention: tuple[AttentionSample, ...]
    bandwidth: tuple[BandwidthSample, ...]
    concurrent: tuple[ConcurrentSample, ...]
    collectives: tuple[CollectiveSample, ...]
    collective_fits: tuple[CollectiveFit, ...]
    link_latency_s: float | None
    """Alpha of one alpha-beta fit over every collective sample (all ops, all group sizes);
    None when no collective was measured (one process, one GPU)."""
    link_bandwidth_bytes_per_s: float | None
    layer_probes: tuple[LayerProbeSample, ...] = ()
    """The runtime's per-layer cost under each parallelism (empty in profiles written before the
    probe existed, and with one process)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **out}
        for key in ("matmul", "attention", "bandwidth", "concurrent", "collectives", "collective_fits",
                    "layer_probes"):
            out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "HardwareProfile":
        if not isinstance(data, dict):
            raise MeshplanError("a hardware profile must be a JSON object")
        if data.get("format") != PROFILE_FORMAT:
            raise MeshplanError(f"not a meshplan hardware profile (format is {data.get('format')!r})")
        if data.get("version") != PROFILE_VERSION:
            raise MeshplanError(f"profile version {data.get('version')!r} is not supported "
                                f"(this meshplan reads version {PROFILE_VERSION})")
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        body.setdefault("layer_probes", [])  # added after version 1 was first written
        known = {f.name for f in fields(cls)}
        _check_keys(body, known, "profile")
        peaks = body["peak_flops"]
        if not isinstance(peaks, dict) or not peaks:
            raise MeshplanError("profile: peak_flops must be a non-empty mapping of precision to FLOP/s")
        for p, v in peaks.items():
            if p not in _PRECISIONS:
                raise MeshplanError(f"profile: peak_flops has unknown precision {p!r}")
            _number(v, f"peak_flops.{p}", positive=True)
        tables = {"matmul": MatmulSample, "attention": AttentionSample, "bandwidth": BandwidthSample,
                  "concurrent": ConcurrentSample, "collectives": CollectiveSample,
                  "collective_fits": CollectiveFit, "layer_probes": LayerProbeSample}
        parsed: dict[str, Any] = {}
        for key, rec in tables.items():
            rows = body[key]
            if not isinstance(rows, list):
                raise MeshplanError(f"profile: {key} must be a list")
            parsed[key] = tuple(_record(rec, row, f"{key}[{i}]") for i, row in enumerate(rows))
        profile = cls(
            meta=_record(ProfileMeta, body["meta"], "meta"),
            device=_record(DeviceFigures, body["device"], "device"),
            peak_flops={p: float(v) for p, v in peaks.items()},
            link_latency_s=_optional(body["link_latency_s"], "link_latency_s"),
            link_bandwidth_bytes_per_s=_optional(body["link_bandwidth_bytes_per_s"],
                                                 "link_bandwidth_bytes_per_s", positive=True),
            **parsed,
        )
        from meshplan.calib.layer_probe import ProbeKind

        kinds = {"single"} | {k.value for k in ProbeKind}
        for i, probe in enumerate(profile.layer_probes):
            if probe.kind not in kinds:
                raise MeshplanError(f"profile: layer_probes[{i}].kind {probe.kind!r} is not one of "
                                    f"{', '.join(sorted(kinds))}")
            if probe.group_size < 1 or probe.layers < 1:
                raise MeshplanError(f"profile: layer_probes[{i}] needs group_size and layers >= 1")
        if (profile.link_latency_s is None) != (profile.link_bandwidth_bytes_per_s is None):
            raise MeshplanError("profile: link_latency_s and link_bandwidth_bytes_per_s go together")
        if profile.device.memory_gib <= 0 or profile.device.hbm_bandwidth_bytes_per_s <= 0:
            raise MeshplanError("profile: device memory_gib and hbm_bandwidth_bytes_per_s must be > 0")
        return profile


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate a profile; every problem is one MeshplanError naming the file."""
    return load_json_file(path, HardwareProfile.from_dict, missing="no such profile file",
                          what="hardware profile (JSON)")


def profile_source(profile: HardwareProfile, path: str | Path) -> str:
    """The source string recorded next to each fitted value."""
    return f"profile:{Path(path).name}:{profile.meta.created_utc}"


def apply_profile_data(cluster: ClusterSpec, profile: HardwareProfile) -> ClusterSpec:
    """``cluster`` with its GPU and intra-node link figures measured by ``profile`` (idempotent:
    every figure comes from the profile). Commands go through ``calib.hardware.resolve_hardware``."""
    if (profile.meta.device_type == "cpu") != (cluster.gpu.name == "cpu"):
        log.warning("profile of a %s device (%s) applied to cluster %r", profile.meta.device_type,
                    profile.device.name, cluster.name)
    share = host_share(profile, cluster.num_gpus)
    peaks = {f"peak_{p}_flops": v * share.compute for p, v in profile.peak_flops.items()}
    gpu = replace(cluster.gpu, memory_gib=profile.device.memory_gib * share.memory,
                  hbm_bandwidth_bytes_per_s=profile.device.hbm_bandwidth_bytes_per_s * share.compute, **peaks)
    if profile.link_bandwidth_bytes_per_s is None:  # no collectives measured: keep the preset link
        return replace(cluster, gpu=gpu)
    return replace(cluster, gpu=gpu,
                   intra_node_bandwidth_bytes_per_s=profile.link_bandwidth_bytes_per_s,
                   intra_node_latency_s=profile.link_latency_s)


@dataclass(frozen=True, kw_only=True)
class HostShare:
    """What one of N processes gets of a CPU host that they share (1.0 and 1.0 on GPUs)."""

    compute: float
    """Per-process matmul FLOP/s with N at once, over the single-process best at the probe's shape."""
    memory: float
    """Fraction of host RAM per process: 1/N."""


def host_share(profile: HardwareProfile, num_procs: int) -> HostShare:
    """On a CPU, N worker processes share the cores and the RAM; a GPU is not shared.

    The compute share is measured, not assumed: the profile timed the same matmul with g = 1..N
    processes at once, one thread each, as ``meshplan train`` runs its CPU workers (even one:
    OMP_NUM_THREADS=1), against the same probe with one process, in interleaved rounds.
    """
    if profile.meta.device_type != "cpu" or not profile.concurrent:
        return HostShare(compute=1.0, memory=1.0)
    by_size = {c.group_size: c for c in profile.concurrent}
    probe = by_size.get(num_procs) or by_size[max(by_size)]
    # The same probe with one process is the reference (measured in the same interleaved rounds);
    # profiles without it fall back on the single-process sweep.
    single = by_size[1].flops_per_s_per_process if 1 in by_size else _single_process_flops_at(profile, probe.dim)
    # More processes than measured: the cores are split further (time-sliced).
    extra = num_procs / probe.group_size if num_procs > probe.group_size else 1.0
    return HostShare(compute=min(1.0, probe.flops_per_s_per_process / single) / extra, memory=1.0 / num_procs)


def _single_process_flops_at(profile: HardwareProfile, dim: int) -> float:
    """Single-process fp32 matmul FLOP/s at a (dim, dim, dim) shape: the nearest measured square."""
    squares = [s for s in profile.matmul if s.precision == "fp32" and s.m == s.n == s.k]
    if not squares:
        return max(profile.peak_flops.values())
    best = min(squares, key=lambda s: abs(s.m - dim))
    return best.flops_per_s


def joint_link_fit(samples: tuple[CollectiveSample, ...]) -> tuple[float, float]:
    """(latency_s, bandwidth_bytes_per_s) of one alpha-beta line through every collective sample.

    The cost model has one intra-node link figure (and one comm efficiency); the per-op,
    per-group-size fits stay in the profile (``collective_fits``) to show how far each op departs
    from it.
    """
    samples = tuple(s for s in samples if CollectiveOp(s.op).raw)
    if len(samples) < 2:
        raise MeshplanError("profile needs at least two collective samples to fit the link")
    x = [bus_factor(CollectiveOp(s.op), s.group_size) * s.message_bytes for s in samples]
    fit = fit_alpha_beta(x, [s.time_s for s in samples])
    return fit.latency_s, fit.bandwidth_bytes_per_s


def _check_keys(data: Any, known: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise MeshplanError(f"profile: {where} must be a mapping")
    missing = known - set(data)
    if missing:
        raise MeshplanError(f"profile: {where} lacks {', '.join(sorted(missing))}")
    extra = set(data) - known
    if extra:
        raise MeshplanError(f"profile: {where} has unknown field(s) {', '.join(sorted(extra))}")


def _number(v: Any, where: str, *, positive: bool = False) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 \
            or (positive and v == 0):
        raise MeshplanError(f"profile: {where} must be a finite {'positive' if positive else 'non-negative'} "
                            f"number, got {v!r}")
    return float(v)


def _optional(v: Any, where: str, *, positive: bool = False) -> float | None:
    return None if v is None else _number(v, where, positive=positive)


def _record(cls: type, data: Any, where: str) -> Any:
    """Build a flat record dataclass from a JSON mapping, checking each field's type."""
    optional = {f.name for f in fields(cls) if f.default is not MISSING}
    if isinstance(data, dict):  # fields added later keep their default in older profiles
        data = {**{k: getattr(cls, k) for k in optional if k not in data}, **data}
    _check_keys(data, {f.name for f in fields(cls)}, where)
    values: dict[str, Any] = {}
    for f in fields(cls):
        v, here = data[f.name], f"{where}.{f.name}"
        if f.type == "str":
            if not isinstance(v, str):
                raise MeshplanError(f"profile: {here} must be a string, got {v!r}")
        elif f.type == "bool":
            if not isinstance(v, bool):
                raise MeshplanError(f"profile: {here} must be true or false, got {v!r}")
        elif f.type == "int":  # every int is a shape, a size or a count: 0 would divide by zero
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MeshplanError(f"profile: {here} must be a positive integer, got {v!r}")
        else:
            v = _number(v, here, positive=f.name.endswith(("time_s", "_per_s", "per_process")))
        values[f.name] = v
    if "op" in values and cls in (CollectiveSample, CollectiveFit):
        try:
            CollectiveOp(values["op"])
        except ValueError:
            raise MeshplanError(f"profile: {where}.op {values['op']!r} is not one of "
                                f"{', '.join(o.value for o in CollectiveOp)}") from None
        if values["group_size"] < 2:
            raise MeshplanError(f"profile: {where}.group_size must be >= 2")
    return cls(**values)
