"""Context parallel on attention: all-to-all (Ulysses) on any backend.

DeepSpeed-Ulysses (Jacobs et al. 2023, Sec. 3): each of the C context ranks holds S/C tokens of
every head. One all-to-all turns q, k, v from (B, S/C, N, H) into (B, S, N/C, H), attention runs
on the whole sequence for N/C heads, and a second all-to-all turns the output back. RoPE is applied
inside the wrapped CoreAttention after the exchange, i.e. on global positions 0..S-1, so the shard
offset needs no bookkeeping. The sequence is split contiguously (rank c holds tokens
[c*S/C, (c+1)*S/C)); load balancing is not needed since attention sees the full sequence.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from meshplan.runtime.collectives import all_to_all


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup, C: int) -> torch.Tensor:
    """(B, S/C, N, H) -> (B, S, N/C, H): send head block j to rank j, receive sequence blocks."""
    B, s, N, H = x.shape
    send = x.reshape(B, s, C, N // C, H).permute(2, 0, 1, 3, 4).reshape(C * B, s, N // C, H)
    recv = all_to_all(send, [B] * C, [B] * C, group)  # (C*B, s, N/C, H), block j = seq chunk j
    return recv.reshape(C, B, s, N // C, H).permute(1, 0, 2, 3, 4).reshape(B, C * s, N // C, H)


def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup, C: int) -> torch.Tensor:
    """(B, S, N/C, H) -> (B, S/C, N, H): the inverse of _seq_to_heads."""
    B, S, n, H = x.shape
    s = S // C
    send = x.reshape(B, C, s, n, H).permute(1, 0, 2, 3, 4).reshape(C * B, s, n, H)
    recv = all_to_all(send, [B] * C, [B] * C, group)  # block j = head block j of my chunk
    return recv.reshape(C, B, s, n, H).permute(1, 2, 0, 3, 4).reshape(B, s, C * n, H)


class UlyssesAttention(nn.Module):
    """Wraps a CoreAttention: heads <-> sequence all-to-all around the full-sequence attention."""

    def __init__(self, inner: nn.Module, group: dist.ProcessGroup, cp_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.group = group
        self.cp_size = cp_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        C = self.cp_size
        if k.shape[2] % C:  # fewer local KV heads than ranks: give each query head its KV head
            rep = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        q, k, v = (_seq_to_heads(t, self.group, C) for t in (q, k, v))
        return _heads_to_seq(self.inner(q, k, v), self.group, C)
