"""Cluster description: the GPU (compute, memory) and the two-level network (node, fabric).

Symbols (the scaling book's): C peak FLOP/s per GPU, W link bandwidth in bytes/s per GPU in one
direction, alpha the per-message latency. A collective inside one node runs on NVLink (W_intra),
one that spans nodes on the NICs (W_inter).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count, check_finite
from meshplan.spec.training import Precision
from meshplan.textfile import read_text_file

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator: dense peak FLOP/s per precision, HBM capacity and bandwidth."""

    name: str
    peak_fp16_flops: float
    peak_bf16_flops: float
    peak_fp8_flops: float
    peak_fp32_flops: float
    memory_gib: float
    """Usable device memory, as the driver reports it."""
    hbm_bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise MeshplanError(f"gpu name must be a non-empty string, got {self.name!r}")
        for f in fields(self):
            if f.name != "name":
                check_finite(f"gpu {self.name!r}: {f.name}", getattr(self, f.name),
                             positive=f.name in ("memory_gib", "hbm_bandwidth_bytes_per_s"))

    def peak_flops(self, precision: Precision) -> float:
        """Dense peak FLOP/s of the tensor cores for this precision; raises if unsupported."""
        value = {
            Precision.FP16: self.peak_fp16_flops,
            Precision.BF16: self.peak_bf16_flops,
            Precision.FP8: self.peak_fp8_flops,
            Precision.FP32: self.peak_fp32_flops,
        }[precision]
        if value <= 0:
            raise MeshplanError(f"gpu {self.name!r} has no {precision.value} support")
        return value

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """``num_nodes`` nodes of ``gpus_per_node`` identical GPUs."""

    name: str
    gpu: GPUSpec
    gpus_per_node: int
    num_nodes: int = 1
    intra_node_bandwidth_bytes_per_s: float
    """Per GPU, one direction, inside a node (NVLink/NVSwitch)."""
    intra_node_latency_s: float
    inter_node_bandwidth_bytes_per_s: float
    """Per GPU, one direction, across nodes (one NIC per GPU)."""
    inter_node_latency_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise MeshplanError(f"cluster name must be a string, got {self.name!r}")
        if not isinstance(self.gpu, GPUSpec):
            raise MeshplanError(f"cluster {self.name!r}: gpu must be a GPU description, got {self.gpu!r}")
        for f in ("gpus_per_node", "num_nodes"):
            check_count(f"cluster {self.name!r}: {f}", getattr(self, f))
        check_count(f"cluster {self.name!r}: GPU count", self.num_gpus)
        for f in ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
            check_finite(f"cluster {self.name!r}: {f}", getattr(self, f), positive=True)
        for f in ("intra_node_latency_s", "inter_node_latency_s"):
            check_finite(f"cluster {self.name!r}: {f}", getattr(self, f))

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def with_size(self, *, num_nodes: int | None = None, gpus_per_node: int | None = None) -> "ClusterSpec":
        return replace(
            self,
            num_nodes=self.num_nodes if num_nodes is None else num_nodes,
            gpus_per_node=self.gpus_per_node if gpus_per_node is None else gpus_per_node,
        )

    def with_gpus(self, num_gpus: int) -> "ClusterSpec":
        """Same hardware, ``num_gpus`` in total: whole nodes, or a part of one node."""
        check_count("GPU count", num_gpus)
        if num_gpus <= self.gpus_per_node:
            return replace(self, num_nodes=1, gpus_per_node=num_gpus) if num_gpus < self.gpus_per_node else replace(self, num_nodes=1)
        if num_gpus % self.gpus_per_node:
            raise MeshplanError(
                f"{num_gpus} GPUs is not a whole number of {self.gpus_per_node}-GPU nodes"
            )
        return replace(self, num_nodes=num_gpus // self.gpus_per_node)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ClusterSpec":
        """Full form (``gpu`` is a dict) or short form (``gpu`` is a preset name)."""
        if not isinstance(data, dict):
            raise MeshplanError("cluster description must be a mapping")
        data = dict(data)
        if "system" in data:  # start from a system preset, override the fields given
            base = system_preset(str(data.pop("system"))).to_dict()
            base.update(data)
            data = base
        gpu = data.get("gpu")
        if isinstance(gpu, str):
            data["gpu"] = gpu_preset(gpu)
        elif isinstance(gpu, dict):
            try:
                data["gpu"] = GPUSpec(**gpu)
            except TypeError as exc:
                raise MeshplanError(f"invalid gpu description: {exc}") from None
        else:
            raise MeshplanError("cluster description needs 'gpu': a preset name or a mapping")
        data.setdefault("name", "custom")
        known = {f.name for f in fields(cls)}
        extra = set(data) - known
        if extra:
            raise MeshplanError(f"unknown cluster field(s): {', '.join(sorted(extra))}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise MeshplanError(f"invalid cluster description: {exc}") from None


@lru_cache(maxsize=1)
def _preset_data() -> dict[str, Any]:
    text = resources.files("meshplan.spec").joinpath("presets/clusters.json").read_text()
    return json.loads(text)


def gpu_names() -> list[str]:
    return sorted(_preset_data()["gpus"])


def system_names() -> list[str]:
    return sorted(_preset_data()["systems"])


def gpu_preset(name: str) -> GPUSpec:
    gpus = _preset_data()["gpus"]
    key = name.lower()
    if key not in gpus:
        raise MeshplanError(f"unknown GPU {name!r}; known: {', '.join(sorted(gpus))}")
    return GPUSpec(name=key, **gpus[key])


def system_preset(name: str, num_nodes: int = 1) -> ClusterSpec:
    systems = _preset_data()["systems"]
    key = name.lower()
    if key not in systems:
        raise MeshplanError(
            f"unknown cluster {name!r}; known systems: {', '.join(sorted(systems))} "
            "(or a GPU name with --gpu, or a YAML/JSON file)"
        )
    entry = dict(systems[key])
    gpu = gpu_preset(entry.pop("gpu"))
    return ClusterSpec(name=key, gpu=gpu, num_nodes=num_nodes, **entry)


def cluster_for_gpu(gpu_name: str, *, num_nodes: int = 1, gpus_per_node: int = 8) -> ClusterSpec:
    """A cluster of a bare GPU type: network figures from the first system preset with that GPU."""
    gpu = gpu_preset(gpu_name)
    for sys_name, entry in sorted(_preset_data()["systems"].items()):
        if entry["gpu"] == gpu.name:
            base = system_preset(sys_name)
            return replace(base, name=f"{gpu.name}x{gpus_per_node}", gpu=gpu,
                           gpus_per_node=gpus_per_node, num_nodes=num_nodes)
    # No system with this GPU: borrow the network of a system with a GPU of the same generation.
    fallback = {"h100-sxm-96gb": "dgx-h100"}.get(gpu.name)
    if fallback is None:
        raise MeshplanError(f"no network figures known for GPU {gpu.name!r}; give a cluster file")
    base = system_preset(fallback)
    return replace(base, name=f"{gpu.name}x{gpus_per_node}", gpu=gpu,
                   gpus_per_node=gpus_per_node, num_nodes=num_nodes)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """A custom cluster from YAML or JSON (see docs: full form or ``system:`` + overrides)."""
    p = Path(path)
    text = read_text_file(p, what="cluster file (YAML or JSON)", missing="no such cluster file")
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml and json raise different types; report either on one line
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MeshplanError(f"{p}: cannot parse cluster file ({msg})") from None
    try:
        return ClusterSpec.from_dict(data)
    except MeshplanError as exc:
        raise MeshplanError(f"{p}: {exc}") from None


def resolve_cluster(
    cluster: str | None = None,
    *,
    gpu: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpus: int | None = None,
) -> ClusterSpec:
    """The CLI's one way to name a cluster: system preset, file path, or ``--gpu`` type.

    ``gpus`` (total) may replace ``nodes``; for the ``cpu`` preset it is the process count.
    """
    if cluster is None and gpu is None:
        raise MeshplanError("name a cluster (--cluster dgx-h100 or a file) or a GPU type (--gpu h100-sxm)")
    if cluster is not None and gpu is not None:
        raise MeshplanError("give either --cluster or --gpu, not both")
    if not (cluster if cluster is not None else gpu).strip():
        raise MeshplanError("the cluster name is empty: give a system preset (see `meshplan clusters`), "
                            "a cluster file or a GPU type")
    if gpu is not None:
        spec = cluster_for_gpu(gpu, gpus_per_node=8 if gpus_per_node is None else gpus_per_node)
    elif Path(cluster).suffix.lower() in (".yaml", ".yml", ".json") or Path(cluster).exists():
        spec = load_cluster_file(cluster)
    else:
        spec = system_preset(cluster)
    if gpus_per_node is not None and gpu is None:
        spec = spec.with_size(gpus_per_node=gpus_per_node)
    if nodes is not None:
        if gpus is not None and gpus != nodes * spec.gpus_per_node:
            raise MeshplanError(
                f"--gpus {gpus} disagrees with --nodes {nodes} x {spec.gpus_per_node} GPUs per node"
            )
        spec = spec.with_size(num_nodes=nodes)
    elif gpus is not None:
        spec = spec.with_gpus(gpus)
    return spec
