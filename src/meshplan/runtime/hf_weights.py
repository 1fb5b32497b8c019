"""``--init-from DIR``: load a local Hugging Face checkpoint into a parallelised model.

Each rank reads only the slice of each tensor it holds: safetensors' ``safe_open(...).get_slice``
reads the requested rows/columns from the memory-mapped file, never the whole model. The slice is
where this rank's shard sits in the full canonical tensor: the expert-parallel block of dim 0,
the expert-tensor-parallel block of F, then the DTensor shard (tensor parallel, FSDP), as in
runtime/models/init.py. The name and layout mapping is meshplan/hf_names.py.

Numerics the runtime fixes (runtime/models/layers.py: RoPE base, norm epsilon, no RoPE scaling)
are checked against config.json: a checkpoint that needs other values is refused in one line.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from meshplan.errors import MeshplanError
from meshplan.hf_names import Source, check_all_mapped, family_of, name_map, normalise_key, rope_row
from meshplan.runtime.models.init import osdp_slice
from meshplan.runtime.state import unique_parameters
from meshplan.runtime.models.layers import NORM_EPS, ROPE_THETA
from meshplan.spec.model import ModelSpec

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_config(model_dir: str | Path) -> dict:
    p = Path(model_dir) / "config.json"
    if not p.is_file():
        raise MeshplanError(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{p}: not valid JSON ({exc.msg})") from None


def check_numerics(cfg: dict, where: str) -> None:
    """Refuse a config whose RoPE base, norm epsilon or RoPE scaling the runtime does not implement."""
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", ROPE_THETA))
    if cfg.get("model_type") != "gpt2" and float(theta) != ROPE_THETA:
        raise MeshplanError(f"{where}: rope_theta {theta} is not supported (the runtime uses {ROPE_THETA:g})")
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind != "default":
        raise MeshplanError(f"{where}: rope_scaling {kind!r} is not supported")
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon", NORM_EPS))
    if float(eps) != NORM_EPS:
        raise MeshplanError(f"{where}: norm epsilon {eps} is not supported (the runtime uses {NORM_EPS:g})")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", cfg.get("model_type") == "mistral"):
        raise MeshplanError(f"{where}: sliding-window attention is not supported by the runtime")


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (index of a sharded checkpoint, or one file)."""
    d = Path(model_dir)
    if (d / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((d / INDEX_FILE).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise MeshplanError(f"{d / INDEX_FILE}: not a safetensors index (no weight_map)") from None
        files = {k: d / v for k, v in weight_map.items()}
        for f in set(files.values()):
            if not f.is_file():
                raise MeshplanError(f"{d / INDEX_FILE}: names {f.name}, which is not in {d}")
        return files
    if (d / SINGLE_FILE).is_file():
        from safetensors import safe_open

        with safe_open(d / SINGLE_FILE, framework="pt") as fh:
            return {k: d / SINGLE_FILE for k in fh.keys()}
    raise MeshplanError(f"{d}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors weights are read)")


def check_checkpoint(model_dir: str | Path, spec: ModelSpec) -> str:
    """Validate ``model_dir`` against ``spec`` before anything is launched; returns the family."""
    cfg = read_config(model_dir)
    check_numerics(cfg, str(model_dir))
    family = family_of(spec, str(cfg.get("model_type", "")).lower() or None)
    check_all_mapped(set(weight_files(model_dir)), name_map(spec, family), family, str(model_dir))
    return family


class _Reader:
    """Open safetensors files on demand; ``get(key)`` is the lazy slice handle of one tensor."""

    def __init__(self, files: dict[str, Path], family: str, stack: ExitStack) -> None:
        self.files = {normalise_key(k, family): (k, f) for k, f in files.items()}
        self.stack = stack
        self.handles: dict[Path, object] = {}

    def get(self, key: str):
        from safetensors import safe_open

        original, f = self.files[key]
        if f not in self.handles:
            self.handles[f] = self.stack.enter_context(safe_open(f, framework="pt"))
        return self.handles[f].get_slice(original)


def read_canonical(reader: _Reader, src: Source, index: tuple[slice, ...]) -> torch.Tensor:
    """The canonical tensor's region ``index`` (one slice per dim), read from the HF tensor(s)."""
    if src.num_experts:
        experts = range(*index[0].indices(src.num_experts))
        one = Source(key="", transpose=src.transpose)
        return torch.stack([_read_one(reader, src.key.format(e=e), one, index[1:]) for e in experts])
    return _read_one(reader, src.key, src, index)


def _read_one(reader: _Reader, key: str, src: Source, index: tuple[slice, ...]) -> torch.Tensor:
    handle = reader.get(key)
    rows = index[0]
    if src.rope_head_dim:  # rows come from a permutation: read the heads they span, then gather
        wanted = torch.tensor([rope_row(r, src.rope_head_dim) for r in range(rows.start, rows.stop)])
        lo = int(wanted.min()) // src.rope_head_dim * src.rope_head_dim
        hi = (int(wanted.max()) // src.rope_head_dim + 1) * src.rope_head_dim
        block = handle[(slice(lo, hi),) + index[1:]]
        return block[wanted - lo]
    if src.out_offset:  # fused q/k/v: shift the output dimension (dim 0 canonical)
        rows = slice(rows.start + src.out_offset, rows.stop + src.out_offset)
    if src.transpose and len(index) == 2:
        return handle[index[1], rows].T.contiguous()
    return handle[(rows,) + index[1:]]


def _global_index(module: nn.Module, short: str, p: torch.Tensor) -> tuple[slice, ...]:
    """Where this rank's copy of ``p`` sits in the full canonical tensor (see runtime/models/init.py)."""
    local = p.to_local() if isinstance(p, DTensor) else p
    shape = list(p.shape)  # the DTensor's global shape; an expert slice's own shape otherwise
    base = [0] * len(shape)
    ep_rank, ep_size = getattr(module, "ep_rank", 0), getattr(module, "ep_size", 1)
    if ep_size > 1:
        base[0] = ep_rank * shape[0]
    etp_size = getattr(module, "etp_size", 1)
    etp_dim = getattr(module, "etp_dims", {}).get(short) if etp_size > 1 else None
    if etp_dim is not None:
        base[etp_dim] = module.etp_rank * shape[etp_dim]
    part, _, part_dim = osdp_slice(module, short)  # an MLP slice (runtime.osdp): its rows / columns
    if part_dim is not None:
        base[part_dim] = part * shape[part_dim]
    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        lshape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    else:
        lshape, offset = tuple(local.shape), (0,) * len(shape)
    return tuple(slice(b + o, b + o + n) for b, o, n in zip(base, offset, lshape, strict=True))


@torch.no_grad()
def load_hf_weights(modules: list[nn.Module], model_dir: str | Path, spec: ModelSpec) -> int:
    """Fill every parameter of ``modules`` (already materialised) from ``model_dir``; returns the
    number of elements this rank read."""
    family = check_checkpoint(model_dir, spec)
    sources = name_map(spec, family)
    files = weight_files(model_dir)
    read = 0
    with ExitStack() as stack:
        reader = _Reader(files, family, stack)
        for name, module, short, p in unique_parameters(modules, spec.tied_embeddings):
            if name not in sources:
                raise MeshplanError(f"{model_dir}: no Hugging Face tensor is mapped to {name}")
            local = p.to_local() if isinstance(p, DTensor) else p
            if local.numel() == 0:
                continue
            value = read_canonical(reader, sources[name], _global_index(module, short, p))
            if tuple(value.shape) != tuple(local.shape):
                raise MeshplanError(f"{model_dir}: {sources[name].key.format(e=0)} gives shape "
                                    f"{tuple(value.shape)} for {name}, expected {tuple(local.shape)}")
            local.copy_(value.to(local.dtype))
            read += value.numel()
    return read
