"""Deterministic, layout-independent initialisation and full-weight gathering.

Every parameter draws its full tensor from a generator seeded by (seed, canonical name) and keeps
the slice this rank holds: a DTensor shard (tensor parallel, FSDP) and/or an expert-parallel slice
of the expert dimension and/or an expert-tensor-parallel slice of the experts' F dimension. So one process and any parallel layout start from identical weights,
which the loss-parity tests rely on. Generating the full tensor on every rank costs memory and
time proportional to the largest parameter; fine for the reference models this runtime trains.
"""

from __future__ import annotations

import re
import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor

INIT_STD = 0.02
"""Normal std of weight matrices and embeddings (GPT-2, Radford et al. 2019; Llama uses the same)."""

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_SLICE_PART = re.compile(r"(^|\.)osdp_slices\.\d+\.")
"""The slices of a split MLP (runtime.osdp.SlicedMLP) are parts of the whole MLP's parameters."""


def canonical_name(name: str, tied_embeddings: bool = False) -> str:
    """Parameter name without wrapper prefixes; a tied LM head is the embedding table."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    name = _SLICE_PART.sub(r"\1", name)
    if tied_embeddings and name == "output.weight":
        return "tok_embeddings.weight"
    return name


def _expert_slice(module: nn.Module) -> tuple[int, int]:
    """(rank, size) of the expert-parallel split of this module's dim 0, or (0, 1)."""
    return getattr(module, "ep_rank", 0), getattr(module, "ep_size", 1)


def _local_slices(p: torch.Tensor) -> tuple[slice, ...] | None:
    """Index of this rank's shard inside the DTensor's global tensor (None if not a DTensor)."""
    if not isinstance(p, DTensor):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def osdp_slice(module: nn.Module, short_name: str) -> tuple[int, int, int | None]:
    """(index, count, dim) of the slice a split MLP's parameter is of its whole tensor
    (``runtime.osdp.SlicedMLP`` sets ``osdp_slice`` on its linears); dim None: whole."""
    index, count, dims = getattr(module, "osdp_slice", (0, 1, {}))
    return index, count, dims.get(short_name)


def _draw(name: str, shape: tuple[int, ...], kind: str, seed: int) -> torch.Tensor:
    if kind == "zeros":
        return torch.zeros(shape)
    if kind == "ones":
        return torch.ones(shape)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * INIT_STD


def _kind(module: nn.Module, short_name: str) -> str:
    if isinstance(module, (nn.LayerNorm,)) or type(module).__name__ == "RMSNorm":
        return "ones" if short_name == "weight" else "zeros"
    return "zeros" if short_name == "bias" else "normal"


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int, tied_embeddings: bool = False) -> None:
    """Materialise (from meta if needed) and fill every parameter; buffers are left as built."""
    device = _target_device(model)
    if any(p.is_meta for p in model.parameters()):
        # Swap tensors in place so a parameter shared by two modules (tied embeddings) stays one
        # object; FSDP2 expects the same (it re-reads its sharded parameters after _apply).
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            model.to_empty(device=device)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for short, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = canonical_name(f"{mod_name}.{short}" if mod_name else short, tied_embeddings)
            ep_rank, ep_size = _expert_slice(module)
            etp_rank, etp_size = getattr(module, "etp_rank", 0), getattr(module, "etp_size", 1)
            etp_dim = getattr(module, "etp_dims", {}).get(short) if etp_size > 1 else None
            full_shape = list(p.shape)
            full_shape[0] *= ep_size
            if etp_dim is not None:
                full_shape[etp_dim] *= etp_size
            part, parts, part_dim = osdp_slice(module, short)  # an MLP slice (runtime.osdp)
            if part_dim is not None:
                full_shape[part_dim] *= parts
            full = _draw(name, tuple(full_shape), _kind(module, short), seed)
            if part_dim is not None:
                n = full_shape[part_dim] // parts
                full = full.narrow(part_dim, part * n, n)
            if ep_size > 1:
                n = p.shape[0]
                full = full[ep_rank * n:(ep_rank + 1) * n]
            if etp_dim is not None:  # expert tensor parallel: this rank's F slice
                n = p.shape[etp_dim]
                full = full.narrow(etp_dim, etp_rank * n, n)
            slices = _local_slices(p)
            if slices is not None:
                p.to_local().copy_(full[slices])
            else:
                p.copy_(full)


def _target_device(model: nn.Module) -> torch.device:
    dev = getattr(model, "init_device", None)
    if dev is not None:
        return torch.device(dev)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
