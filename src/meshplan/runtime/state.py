"""Gather the full (unsharded) weights of a parallelised model, keyed by canonical parameter name.

Used by the parity tests and by anything that wants one-process weights back. Every rank must
call it (DTensor.full_tensor and the expert all-gather are collectives).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshplan.runtime.models.init import canonical_name, osdp_slice


@torch.no_grad()
def full_parameters(modules: list[nn.Module], tied_embeddings: bool = False) -> dict[str, torch.Tensor]:
    """Canonical name -> full fp32 CPU tensor for every parameter of ``modules``."""
    out: dict[str, torch.Tensor] = {}
    slices: dict[str, dict[int, torch.Tensor]] = {}  # split MLPs' parameters, by slice index
    for name, module, short, p in unique_parameters(modules, tied_embeddings):
        t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        etp_size = getattr(module, "etp_size", 1)
        if etp_size > 1 and short in getattr(module, "etp_dims", {}):  # expert F slices
            parts = [torch.empty_like(t) for _ in range(etp_size)]
            dist.all_gather(parts, t.contiguous(), group=module.etp_group)
            t = torch.cat(parts, dim=module.etp_dims[short])
        ep_size = getattr(module, "ep_size", 1)
        if ep_size > 1:  # experts split over the ep group: concatenate along dim 0
            parts = [torch.empty_like(t) for _ in range(ep_size)]
            dist.all_gather(parts, t.contiguous(), group=module.group)
            t = torch.cat(parts, dim=0)
        part, parts, part_dim = osdp_slice(module, short)
        if part_dim is not None:  # a slice of an MLP split by OSDP: whole once all are met
            slices.setdefault(name, {})[part] = t
            if len(slices[name]) < parts:
                continue
            t = torch.cat([slices[name][i] for i in range(parts)], dim=part_dim)
        out[name] = t.float().cpu().clone()
    return out


def unique_parameters(modules: list[nn.Module], tied_embeddings: bool = False
                      ) -> Iterator[tuple[str, nn.Module, str, nn.Parameter]]:
    """(canonical name, owning module, short name, parameter) of every parameter of
    ``modules``, each once (a tied weight is met twice)."""
    seen: set[int] = set()
    for root in modules:
        for mod_name, module in root.named_modules():
            for short, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                yield canonical_name(f"{mod_name}.{short}" if mod_name else short, tied_embeddings), module, short, p
