"""Ring attention for context parallel (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"), written with point-to-point send/recv so it runs on gloo (CPU) and nccl.

Rank c of C holds the contiguous tokens [c*s, (c+1)*s) of q, k and v (s = S/C). K/V blocks travel
around the ring; rank c combines the blocks j <= c (causal: later blocks are fully masked) with an
online softmax, keeping per-row log-sum-exp (Milakov and Gimelshein 2018; FlashAttention,
Dao et al. 2022, Sec. 3.1). Backward recomputes each block's probabilities from the saved
log-sum-exp and sends the K/V block together with its accumulated dK/dV around the ring once
more, so each block's gradient arrives back at its owner after C hops.
The split is contiguous, not load-balanced: the last rank does the most work.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from meshplan.runtime.models.layers import apply_rope_part


def _ring_pass(tensors: list[torch.Tensor], group: dist.ProcessGroup, rank: int, size: int) -> list[torch.Tensor]:
    """Send each tensor to the next rank of the ring and receive the previous rank's."""
    ranks = dist.get_process_group_ranks(group)
    nxt, prv = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    recv = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in recv]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """Scaled scores (B, N, s, s) of q, k (B, N, s, H), causal mask on the diagonal block."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if diagonal:
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, rank, size):
        # q, k, v: (B, N, s, H) float32 working copies
        out = q.new_zeros(q.shape[:-1] + v.shape[-1:])  # value width may differ (MLA)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)  # (B, N, s)
        kb, vb = k, v
        for step in range(size):
            j = (rank - step) % size  # owner of the block we hold now
            if j <= rank:
                sc = _scores(q, kb, diagonal=j == rank)
                blk_lse = torch.logsumexp(sc, dim=-1)  # (B, N, s)
                blk_out = torch.softmax(sc, dim=-1) @ vb
                new_lse = torch.logaddexp(lse, blk_lse)
                out = out * torch.exp(lse - new_lse).unsqueeze(-1) + blk_out * torch.exp(blk_lse - new_lse).unsqueeze(-1)
                lse = new_lse
            if step < size - 1:
                kb, vb = _ring_pass([kb, vb], group, rank, size)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.rank, ctx.size = group, rank, size
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, rank, size = ctx.group, ctx.rank, ctx.size
        dout = dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)  # (B, N, s, 1): rowsum(dO * O)
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq = torch.zeros_like(q)
        kb, vb = k, v
        dkb, dvb = torch.zeros_like(k), torch.zeros_like(v)
        for step in range(size):
            j = (rank - step) % size
            if j <= rank:
                p = torch.exp(_scores(q, kb, diagonal=j == rank) - lse.unsqueeze(-1))  # (B, N, s, s)
                dvb = dvb + p.transpose(-1, -2) @ dout
                ds = p * (dout @ vb.transpose(-1, -2) - delta)
                dq = dq + (ds @ kb) * scale
                dkb = dkb + (ds.transpose(-1, -2) @ q) * scale
            # After `size` hops every block (and its gradient) is back with its owner.
            kb, vb, dkb, dvb = _ring_pass([kb, vb, dkb, dvb], group, rank, size)
        return dq, dkb, dvb, None, None, None


class RingAttention(nn.Module):
    """Replaces a CoreAttention under ring context parallel: RoPE on global positions, then the ring."""

    def __init__(self, core: nn.Module, group: dist.ProcessGroup, cp_rank: int, cp_size: int) -> None:
        super().__init__()
        self.rope = core.rope
        self.rope_dim = core.rope_dim
        self.group, self.cp_rank, self.cp_size = group, cp_rank, cp_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: (B, s, Nq, H), k/v: (B, s, Nk, H) on this rank's s = S/cp tokens -> (B, s, Nq, H)."""
        s = q.shape[1]
        if self.rope:
            pos = torch.arange(self.cp_rank * s, (self.cp_rank + 1) * s, device=q.device)
            q, k = apply_rope_part(q, pos, self.rope_dim), apply_rope_part(k, pos, self.rope_dim)
        if k.shape[2] != q.shape[2]:  # GQA: expand here so autograd sums the KV-head gradients
            rep = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        dtype = q.dtype
        q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # (B, N, s, H), fp32 softmax
        out = _RingAttention.apply(q, k, v, self.group, self.cp_rank, self.cp_size)
        return out.transpose(1, 2).to(dtype)
