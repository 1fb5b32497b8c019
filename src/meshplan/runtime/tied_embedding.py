"""Tied embeddings under pipeline parallel (GPT-2): the first stage owns ``tok_embeddings.weight``,
the last keeps its own copy as ``output.weight``; the copy is made equal to the first stage's at start
and both receive the sum of the two gradients after every step (Megatron-LM's approach, Shoeybi et al.
2019, Sec. 3). Used by :func:`meshplan.runtime.pipeline.build_pipeline`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshplan.errors import MeshplanError


def has_tied_embeddings(model: nn.Module) -> bool:
    """True when the output projection shares its weight with the token embedding (GPT-2)."""
    tok, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    return tok is not None and out is not None and out.weight is tok.weight


def local_part(t: torch.Tensor) -> torch.Tensor:
    """The rank-local part of a (possibly DTensor) parameter or gradient."""
    return t.to_local() if isinstance(t, DTensor) else t


@dataclass(frozen=True)
class TiedEmbedding:
    """The process group joining the first and last pipeline ranks of one (dp, cp, tp) coordinate."""

    group: dist.ProcessGroup
    src_rank: int  # global rank holding stage 0 (owner of tok_embeddings)
    weight: nn.Parameter  # tok_embeddings.weight on the first stage, output.weight on the last

    def sync_weight(self) -> None:
        """Make the last stage's copy equal to the first stage's matrix (once, after init)."""
        with torch.no_grad():
            local = local_part(self.weight.data)
            buf = local.contiguous()
            dist.broadcast(buf, src=self.src_rank, group=self.group)
            if buf.data_ptr() != local.data_ptr():
                local.copy_(buf)

    def all_reduce_grad(self) -> None:
        """Sum the embedding-side and output-side gradients: both copies then take the same update."""
        if self.weight.grad is None:
            raise MeshplanError("tied embedding weight has no gradient after the pipeline step")
        w = self.weight
        if isinstance(w, DTensor) and tuple(w.grad.placements) != tuple(w.placements):
            # e.g. a vocab-parallel embedding's gradient can come back Replicate; both copies
            # must hold the same shard before their local tensors are summed.
            w.grad = w.grad.redistribute(w.device_mesh, w.placements)
        grad = local_part(w.grad)
        buf = grad.contiguous()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        if buf.data_ptr() != grad.data_ptr():
            grad.copy_(buf)


def tied_pair_groups(pp_mesh_ranks: torch.Tensor) -> tuple[list[list[int]], list[dist.ProcessGroup]]:
    """One (first pp rank, last pp rank) group per pipeline; every rank must create all of them."""
    pairs = [[int(r[0]), int(r[-1])] for r in pp_mesh_ranks]
    groups = [dist.new_group(ranks=p) for p in pairs]
    return pairs, groups
