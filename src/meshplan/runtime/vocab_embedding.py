"""Tensor-parallel token embedding whose backward stays on the rank's vocabulary shard.

torch's RowwiseParallel embedding looks tokens up through DTensor (a masked partial lookup), but
torch 2.13 has no row-wise strategy for its backward (``embedding_dense_backward``): every tp rank
computes a partial gradient of the whole (V, D) table and reduces it over tp, tp times the
shard's bytes, plus its fp32 cast for the data-parallel reduction (a llama3.1-405b tp8 rank: 3.9
GiB of bf16 and 7.8 GiB of fp32 where its shard's gradient is 0.5 and 1.0; found by the dry run,
docs/dryrun.md). Megatron's VocabParallelEmbedding (Shoeybi et al. 2019, Sec. 3) looks up only the
local rows: ids outside the shard are masked, the output is partial over tp (summed by
RowwiseParallel's output redistribution, a reduce-scatter with sequence parallel, an all-reduce
without: the collectives torch issues for its masked lookup too), and the gradient is the shard's.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial


def _vocab_parallel_lookup(self: nn.Embedding, ids: torch.Tensor) -> DTensor:
    """ids (B, S), the same on every tp rank; weight (V, D) sharded on V. Returns (B, S, D), partial."""
    weight = self.weight
    mesh, local_w = weight.device_mesh, weight.to_local()  # (V/tp, D); its gradient stays (V/tp, D)
    local_ids = ids.to_local() if isinstance(ids, DTensor) else ids
    # Shard(0) splits V as torch.chunk does: ceil(V / tp) rows per rank, the last ones fewer.
    chunk = -(-weight.shape[0] // mesh.size())
    start, rows = min(mesh.get_local_rank() * chunk, weight.shape[0]), local_w.shape[0]
    outside = (local_ids < start) | (local_ids >= start + rows)
    out = F.embedding((local_ids - start).masked_fill(outside, 0), local_w)  # (B, S, D)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    return DTensor.from_local(out, mesh, [Partial()], run_check=False)


def use_vocab_parallel_lookup(embedding: nn.Embedding) -> None:
    """After RowwiseParallel sharded ``embedding`` on V over a 1-D tp mesh: look up the local rows
    only (see above)."""
    embedding.forward = types.MethodType(_vocab_parallel_lookup, embedding)
