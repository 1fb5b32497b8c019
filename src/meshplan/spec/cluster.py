"""Cluster description: the GPU (compute, memory) and the two-level network (scale-up domain,
scale-out fabric).

Symbols (the scaling book's): C peak FLOP/s per GPU, W link bandwidth in bytes/s per GPU in one
direction, alpha the per-message latency. A collective inside one NVLink (scale-up) domain runs
at NVLink speed (W_intra), one that spans domains on the NICs (W_inter). The domain is a node on
DGX/HGX systems (8 GPUs) and a whole rack on GB200/GB300 NVL72 (72 GPUs over 18 trays of 4).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count, check_finite
from meshplan.shipped import shipped_json, shipped_text
from meshplan.spec.training import Precision, Recipe, TrainingSpec
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
    peak_fp4_flops: float = 0.0
    """Dense fp4 tensor-core peak (Blackwell NVFP4/MXFP4, CDNA4 MXFP4); 0: no fp4."""
    memory_gib: float
    """Usable device memory, as the driver reports it (datasheet GB in GiB where no driver
    figure is published: see the preset's source)."""
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float = 0.0
    """The part's scale-up link (NVLink, Infinity Fabric), per GPU, one direction; 0: unknown.
    Systems give the bandwidth a collective sees (``ClusterSpec.intra_node_bandwidth_bytes_per_s``);
    this is the part's own figure, used for a GPU that has no system preset."""
    sfu_exp_per_s: float = 0.0
    """Exponentials per second the special function units issue (MUFU.EX2), the rate that bounds
    an attention kernel's softmax: the datasheets' 'Attention acceleration (SFU EX2)' row (B200 /
    GB200 5e12, B300 / GB300 10.7e12: Blackwell Ultra doubles the SFU rate, NVIDIA blog 'Inside
    NVIDIA Blackwell Ultra', 2025). 0: unknown, the attention core is not rescaled
    (cost/mixers.py attention_exp_factor)."""
    block_scaled_recipes: tuple[str, ...] = ()
    """Block-scaled recipes the tensor cores run natively (``Recipe.block_scaled``: mxfp8,
    nvfp4, mxfp4); empty before Blackwell / CDNA4."""
    source: str = ""
    """Where the figures come from (datasheet, page)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise MeshplanError(f"gpu name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.block_scaled_recipes, (list, tuple)):
            raise MeshplanError(f"gpu {self.name!r}: block_scaled_recipes must be a list of recipe names, "
                                f"got {self.block_scaled_recipes!r}")
        object.__setattr__(self, "block_scaled_recipes", tuple(self.block_scaled_recipes))
        if not isinstance(self.source, str):
            raise MeshplanError(f"gpu {self.name!r}: source must be text, got {self.source!r}")
        for r in self.block_scaled_recipes:
            if r not in {x.value for x in Recipe if x.block_scaled}:
                raise MeshplanError(f"gpu {self.name!r}: block_scaled_recipes has {r!r}; "
                                    f"known: {', '.join(x.value for x in Recipe if x.block_scaled)}")
        for f in fields(self):
            if f.name in ("name", "block_scaled_recipes", "source"):
                continue
            check_finite(f"gpu {self.name!r}: {f.name}", getattr(self, f.name),
                         positive=f.name in ("memory_gib", "hbm_bandwidth_bytes_per_s"))

    def peak_flops(self, precision: Precision) -> float:
        """Dense peak FLOP/s of the tensor cores for this precision; raises if unsupported."""
        value = {
            Precision.FP16: self.peak_fp16_flops,
            Precision.BF16: self.peak_bf16_flops,
            Precision.FP8: self.peak_fp8_flops,
            Precision.FP4: self.peak_fp4_flops,
            Precision.FP32: self.peak_fp32_flops,
        }[precision]
        if value <= 0:
            raise MeshplanError(f"gpu {self.name!r} has no {precision.value} support")
        return value

    def check_recipe(self, recipe: Recipe | None) -> None:
        """Raise if ``recipe`` needs block scaling that this GPU's tensor cores do not have."""
        if recipe is not None and recipe.block_scaled and recipe.value not in self.block_scaled_recipes:
            have = ", ".join(self.block_scaled_recipes) or "none"
            raise MeshplanError(f"gpu {self.name!r} has no {recipe.value} tensor cores "
                                f"(block-scaled recipes it runs: {have})")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """``num_nodes`` nodes of ``gpus_per_node`` identical GPUs, in NVLink domains of
    ``scale_up_gpus`` GPUs."""

    name: str
    gpu: GPUSpec
    gpus_per_node: int
    """GPUs per host (a DGX node, an NVL72 compute tray of 4)."""
    num_nodes: int = 1
    scale_up_domain_gpus: int = 0
    """GPUs that one NVLink switch fabric connects (72 on GB200/GB300 NVL72); 0: one node (DGX,
    HGX: 8). A group that fits in the domain runs at NVLink speed even if it spans hosts."""
    intra_node_bandwidth_bytes_per_s: float
    """Per GPU, one direction, inside the scale-up domain (NVLink/NVSwitch)."""
    intra_node_latency_s: float
    inter_node_bandwidth_bytes_per_s: float = 0.0
    """Per GPU, one direction, across domains (the node's NICs shared by its GPUs). Derived
    from ``nics_per_node * nic_bandwidth_bytes_per_s / gpus_per_node`` when those are given."""
    inter_node_latency_s: float
    nics_per_node: int = 0
    """Scale-out NICs per node (per NVL72 tray); 0: described by inter_node_bandwidth alone."""
    nic_bandwidth_bytes_per_s: float = 0.0
    """Line rate of one NIC, one direction (400 Gb/s ConnectX-7 = 50e9, 800 Gb/s ConnectX-8 = 100e9)."""
    clock_fraction: float = 1.0
    """Sustained tensor-core clock over the boost clock the datasheet peaks assume: a power cap
    or a locked clock (``nvidia-smi -pl`` / ``-lgc``) below 1. Peak FLOP/s = SMs x FLOP/clock x
    clock, so every compute peak scales by this factor; HBM and link bandwidths do not (they
    run on their own clocks). MFU stays on the datasheet peak."""
    host_device_bandwidth_bytes_per_s: float = 0.0
    """Host <-> GPU link per GPU, one direction (PCIe Gen5 x16 ~55e9 measured of 64e9; Grace
    NVLink-C2C 450e9 per Grace). 0: unknown, offload cannot be estimated."""
    host_memory_gib_per_node: float = 0.0
    """Host DRAM per node (per NVL72 tray), for offloaded tensors; 0: unknown."""
    host_memory_bandwidth_bytes_per_s: float = 0.0
    """Peak host DRAM bandwidth per node (channels x transfer rate x 8 bytes, all sockets), which
    the host's optimizer step (CPU Adam) streams through; 0: unknown."""
    host_memory_stream_efficiency: float = 0.5
    """Fraction of ``host_memory_bandwidth_bytes_per_s`` that streaming traffic sustains, here the
    GPUs' DMA copies of offloaded activations, which all GPUs of the node (of a Grace: its two
    Blackwell) write to and read from the same DRAM: each GPU's share of it caps its offload rate
    below its own link (cost/offload.py ``activation_copy_bytes_per_s``). STREAM copy/triad on
    2-socket Xeon / EPYC servers sustains 50-70% of the DDR channels' peak (McCalpin's STREAM
    results, cs.virginia.edu/stream; the same fraction ``OffloadFactors.cpu_adam_bandwidth_efficiency``
    takes): the low end, as the copies contend with the data loader and the host's own traffic."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise MeshplanError(f"cluster name must be a string, got {self.name!r}")
        if not isinstance(self.gpu, GPUSpec):
            raise MeshplanError(f"cluster {self.name!r}: gpu must be a GPU description, got {self.gpu!r}")
        for f in ("gpus_per_node", "num_nodes"):
            check_count(f"cluster {self.name!r}: {f}", getattr(self, f))
        check_count(f"cluster {self.name!r}: GPU count", self.num_gpus)
        for f in ("scale_up_domain_gpus", "nics_per_node"):
            check_count(f"cluster {self.name!r}: {f}", getattr(self, f), minimum=0)
        if self.scale_up_domain_gpus and self.scale_up_domain_gpus < self.gpus_per_node:
            raise MeshplanError(f"cluster {self.name!r}: scale_up_domain_gpus={self.scale_up_domain_gpus} "
                                f"is smaller than a node of {self.gpus_per_node} GPUs")
        v = self.clock_fraction
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
            raise MeshplanError(f"cluster {self.name!r}: clock_fraction must be in (0, 1], got {v!r}")
        # given with NICs too, where it must agree with them (0: derived from them)
        check_finite(f"cluster {self.name!r}: inter_node_bandwidth_bytes_per_s", self.inter_node_bandwidth_bytes_per_s)
        if self.nics_per_node:
            check_finite(f"cluster {self.name!r}: nic_bandwidth_bytes_per_s", self.nic_bandwidth_bytes_per_s,
                         positive=True)
            # One fact, one place: the per-GPU figure follows from the NICs (a value given as
            # well must agree: a stale one, e.g. after a change of node size, is refused).
            derived = self.nics_per_node * self.nic_bandwidth_bytes_per_s / self.gpus_per_node
            given = self.inter_node_bandwidth_bytes_per_s
            if given and (not isinstance(given, (int, float)) or abs(given - derived) > 1e-6 * derived):
                raise MeshplanError(
                    f"cluster {self.name!r}: inter_node_bandwidth_bytes_per_s={given!r} disagrees with "
                    f"nics_per_node x nic_bandwidth_bytes_per_s / gpus_per_node = {derived:.4g}; "
                    "give one or the other")
            object.__setattr__(self, "inter_node_bandwidth_bytes_per_s", derived)
        for f in ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
            check_finite(f"cluster {self.name!r}: {f}", getattr(self, f), positive=True)
        for f in ("host_device_bandwidth_bytes_per_s", "host_memory_gib_per_node",
                  "host_memory_bandwidth_bytes_per_s"):  # 0: unknown (no offload offered)
            check_finite(f"cluster {self.name!r}: {f}", getattr(self, f))
        for f in ("intra_node_latency_s", "inter_node_latency_s"):
            check_finite(f"cluster {self.name!r}: {f}", getattr(self, f))
        v = self.host_memory_stream_efficiency
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
            raise MeshplanError(f"cluster {self.name!r}: host_memory_stream_efficiency must be in (0, 1], got {v!r}")

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def scale_up_gpus(self) -> int:
        """GPUs of one NVLink domain: ``scale_up_domain_gpus``, or the node when that is 0."""
        return self.scale_up_domain_gpus or self.gpus_per_node

    def compute_peak_flops(self, training: TrainingSpec) -> float:
        """C of the GEMMs: the GPU's dense peak for the training precision (fp4 peak for fp4),
        after checking its recipe runs on this GPU, times ``clock_fraction``."""
        self.gpu.check_recipe(training.recipe)
        return self.gpu.peak_flops(training.precision) * self.clock_fraction

    def with_size(self, *, num_nodes: int | None = None, gpus_per_node: int | None = None) -> "ClusterSpec":
        """Same hardware, other counts. A new node size keeps the NICs per GPU (a node of 8
        built from 4-GPU trays has twice their NICs); a node-sized NVLink domain stays one node."""
        gpn = self.gpus_per_node if gpus_per_node is None else gpus_per_node
        nics = self.nics_per_node
        if nics and gpn != self.gpus_per_node:
            if (nics * gpn) % self.gpus_per_node:
                raise MeshplanError(f"cluster {self.name!r}: {nics} NICs per {self.gpus_per_node} GPUs "
                                    f"is not a whole number of NICs for a {gpn}-GPU node")
            nics = nics * gpn // self.gpus_per_node
        per_gpu = gpn / self.gpus_per_node  # host memory and its bandwidth keep their share per GPU
        return replace(self, num_nodes=self.num_nodes if num_nodes is None else num_nodes,
                       gpus_per_node=gpn, nics_per_node=nics,
                       host_memory_gib_per_node=self.host_memory_gib_per_node * per_gpu,
                       host_memory_bandwidth_bytes_per_s=self.host_memory_bandwidth_bytes_per_s * per_gpu)

    def with_gpus(self, num_gpus: int) -> "ClusterSpec":
        """Same hardware, ``num_gpus`` in total: whole nodes, or a part of one node."""
        check_count("GPU count", num_gpus)
        if num_gpus <= self.gpus_per_node:
            # Part of one node: its GPUs keep their NVLink and their share of the NICs.
            domain = self.scale_up_domain_gpus and max(self.scale_up_domain_gpus, num_gpus)
            share = num_gpus / self.gpus_per_node  # and their share of the host's memory
            return replace(self, num_nodes=1, gpus_per_node=num_gpus, scale_up_domain_gpus=domain,
                           nics_per_node=0, inter_node_bandwidth_bytes_per_s=self.inter_node_bandwidth_bytes_per_s,
                           host_memory_gib_per_node=self.host_memory_gib_per_node * share,
                           host_memory_bandwidth_bytes_per_s=self.host_memory_bandwidth_bytes_per_s * share) \
                if num_gpus < self.gpus_per_node else replace(self, num_nodes=1)
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
            if base["nics_per_node"]:  # derived again from the NICs (and any node size given)
                base.pop("inter_node_bandwidth_bytes_per_s")
                if "inter_node_bandwidth_bytes_per_s" in data and not {"nics_per_node", "nic_bandwidth_bytes_per_s"} & set(data):
                    base["nics_per_node"] = 0  # the file gives the per-GPU figure itself: it replaces the NICs
            base.update(data)
            data = base
        gpu = data.get("gpu")
        if isinstance(gpu, str):
            data["gpu"] = gpu_preset(gpu)
        elif isinstance(gpu, dict):
            data["gpu"] = GPUSpec(**_checked_fields("gpu", {"name": "custom-gpu", **gpu}, GPUSpec))
        else:
            raise MeshplanError("cluster description needs 'gpu': a preset name or a mapping")
        data.setdefault("name", "custom")
        return cls(**_checked_fields("cluster", data, cls))


_EXAMPLE_HINT = "see `meshplan clusters --example` or docs/clusters.md"


def _checked_fields(what: str, data: dict[str, Any], spec: type) -> dict[str, Any]:
    """``data`` with every field of ``spec`` present, none unknown, and numbers as numbers.

    PyYAML follows YAML 1.1, where ``25e9`` (no dot, no exponent sign) is a string, not a float:
    a numeric field takes a number written as text, and rejects anything else by name."""
    known = {f.name: f for f in fields(spec)}
    extra = sorted(set(data) - set(known))
    if extra:
        raise MeshplanError(f"unknown {what} field(s): {', '.join(extra)} ({_EXAMPLE_HINT})")
    missing = [n for n, f in known.items() if n not in data and f.default is MISSING]
    if missing:
        raise MeshplanError(f"{what} is missing field(s): {', '.join(missing)} ({_EXAMPLE_HINT})")
    out = dict(data)
    for name, value in data.items():
        kind = known[name].type
        if kind not in ("int", "float") or isinstance(value, bool):
            continue
        if isinstance(value, str):
            try:
                value = int(value) if kind == "int" else float(value)
            except ValueError:
                raise MeshplanError(f"{what} field {name} must be a number, got {value!r}") from None
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise MeshplanError(f"{what} field {name} must be a finite number, got {value!r}")
        out[name] = value
    return out


@lru_cache(maxsize=1)
def _preset_data() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", "presets/clusters.json")


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
    entry = {k: v for k, v in systems[key].items() if not k.startswith("_")}  # "_source": prose
    gpu = gpu_preset(entry.pop("gpu"))
    return ClusterSpec(name=key, gpu=gpu, num_nodes=num_nodes, **entry)


def cluster_for_gpu(gpu_name: str, *, num_nodes: int = 1, gpus_per_node: int = 8) -> ClusterSpec:
    """A cluster of a bare GPU type: network figures from the first system preset with that GPU
    (its NVLink domain, and its NICs per GPU for a node of ``gpus_per_node``)."""
    gpu = gpu_preset(gpu_name)
    systems = sorted(_preset_data()["systems"].items())
    # No system with this GPU: borrow the network of a system with a GPU of the same generation.
    sys_name = next((n for n, e in systems if e["gpu"] == gpu.name), None) or _preset_data()["borrow_network"].get(gpu.name)
    if sys_name is None:
        raise MeshplanError(f"no network figures known for GPU {gpu.name!r}; give a cluster file")
    base = system_preset(sys_name).with_size(gpus_per_node=gpus_per_node, num_nodes=num_nodes)
    return replace(base, name=f"{gpu.name}x{gpus_per_node}", gpu=gpu)


def example_cluster_yaml() -> str:
    """The commented example cluster file (``meshplan clusters --example``; docs/clusters.md)."""
    return shipped_text("meshplan.spec", "presets/cluster_example.yaml")


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
