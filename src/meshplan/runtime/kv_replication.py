"""GQA with more tensor-parallel ranks than KV heads: replicate each KV head over tp ranks.

With K KV heads and tp = T > K (T a multiple of K), tp rank t keeps query heads
[t*N/T, (t+1)*N/T), which all belong to KV head t // (T/K) (Megatron-LM's choice, as in its
GQA support). Every rank holds the full wk/wv (K*H x D) and computes only its head. Gradients:
each rank's contribution to the weight covers its head's rows and to the input covers only its
query heads, so both are summed over tp in backward (Megatron's ``f`` operator).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial

from meshplan.runtime.collectives import all_reduce_grad


class ReplicatedKVProjection(nn.Module):
    """Replaces attention.wk / wv (nn.Linear D -> K*H); keeps the names ``weight`` and ``bias``."""

    def __init__(self, linear: nn.Linear, head_dim: int, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        num_kv = linear.weight.shape[0] // head_dim
        self.head = tp_rank // (tp_size // num_kv)
        self.head_dim = head_dim
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):  # sequence parallel: the gathered input; our grad is partial
            x = x.to_local(grad_placements=[Partial()])
        else:
            x = all_reduce_grad(x, self.group)
        rows = slice(self.head * self.head_dim, (self.head + 1) * self.head_dim)
        w = all_reduce_grad(self.weight, self.group)[rows]  # (H, D)
        b = all_reduce_grad(self.bias, self.group)[rows] if self.bias is not None else None
        return F.linear(x, w, b)  # (B, S, H): one KV head
