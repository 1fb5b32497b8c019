"""Ring attention for context parallel (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"), written with point-to-point send/recv so it runs on gloo (CPU) and nccl.

Rank c of C holds the contiguous tokens [c*s, (c+1)*s) of q, k and v (s = S/C). K/V blocks travel
around the ring; rank c combines the blocks j <= c (causal: later blocks are fully masked) with an
online softmax, keeping per-row log-sum-exp (Milakov and Gimelshein 2018; FlashAttention,
Dao et al. 2022, Sec. 3.1). Backward recomputes each block's probabilities from the saved
log-sum-exp and sends the K/V block together with its accumulated dK/dV around the ring once
more, so each block's gradient arrives back at its owner after C hops. GQA K/V travel un-expanded
(Nk heads) in the compute dtype; the query heads of a group share them by broadcasting.
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
    """Scaled fp32 scores (B, Nk, g, s, s) of q (B, Nk, g, s, H) and one K block (B, Nk, s, H):
    the g query heads of a GQA group share their KV head by broadcasting, never by a copy. Causal
    mask on the diagonal block."""
    s = q.shape[-2]
    scores = (q.float() @ k.float().unsqueeze(2).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if diagonal:
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores


class _RingAttention(torch.autograd.Function):
    """q: (B, Nk, g, s, H) grouped by KV head; k, v: (B, Nk, s, H), the KV heads themselves, in the
    compute dtype: what travels around the ring is the un-expanded K/V of the cost model (2 s Nk H
    elements per hop). Softmax statistics, output and gradients are accumulated in fp32."""

    @staticmethod
    def forward(ctx, q, k, v, group, rank, size):
        with torch.autocast(q.device.type, enabled=False):  # fp32 softmax, as in the backward
            return _RingAttention._forward(ctx, q, k, v, group, rank, size)

    @staticmethod
    def _forward(ctx, q, k, v, group, rank, size):
        out = q.new_zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32)  # value width may differ (MLA)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)  # (B, Nk, g, s)
        kb, vb = k, v
        for step in range(size):
            j = (rank - step) % size  # owner of the block we hold now
            if j <= rank:
                sc = _scores(q, kb, diagonal=j == rank)
                blk_lse = torch.logsumexp(sc, dim=-1)
                blk_out = torch.softmax(sc, dim=-1) @ vb.float().unsqueeze(2)
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
        dout = dout.float().contiguous()
        delta = (dout * out).sum(-1, keepdim=True)  # (B, Nk, g, s, 1): rowsum(dO * O)
        scale = 1.0 / math.sqrt(q.shape[-1])
        qf = q.float()
        dq = torch.zeros_like(qf)
        kb, vb = k, v
        # dK/dV of the travelling block, summed over the g query heads of each KV head, in fp32.
        dkb = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dvb = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for step in range(size):
            j = (rank - step) % size
            if j <= rank:
                p = torch.exp(_scores(q, kb, diagonal=j == rank) - lse.unsqueeze(-1))  # (B, Nk, g, s, s)
                dvb = dvb + (p.transpose(-1, -2) @ dout).sum(2)
                ds = p * (dout @ vb.float().unsqueeze(2).transpose(-1, -2) - delta)
                dq = dq + (ds @ kb.float().unsqueeze(2)) * scale
                dkb = dkb + (ds.transpose(-1, -2) @ qf).sum(2) * scale
            # After `size` hops every block (and its gradient) is back with its owner.
            kb, vb, dkb, dvb = _ring_pass([kb, vb, dkb, dvb], group, rank, size)
        return dq.to(q.dtype), dkb.to(k.dtype), dvb.to(v.dtype), None, None, None


class RingAttention(nn.Module):
    """Replaces a CoreAttention under ring context parallel: RoPE on global positions, then the ring."""

    def __init__(self, core: nn.Module, group: dist.ProcessGroup, cp_rank: int, cp_size: int) -> None:
        super().__init__()
        self.rope = core.rope
        self.rope_dim = core.rope_dim
        self.group, self.cp_rank, self.cp_size = group, cp_rank, cp_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: (B, s, Nq, H), k/v: (B, s, Nk, H) on this rank's s = S/cp tokens -> (B, s, Nq, H).

        Query head n uses KV head n // (Nq/Nk) (GQA, as repeat_interleave in CoreAttention)."""
        B, s, Nq, _ = q.shape
        if self.rope:
            pos = torch.arange(self.cp_rank * s, (self.cp_rank + 1) * s, device=q.device)
            q, k = apply_rope_part(q, pos, self.rope_dim), apply_rope_part(k, pos, self.rope_dim)
        Nk = k.shape[2]
        dtype = torch.promote_types(q.dtype, v.dtype)
        if torch.is_autocast_enabled(q.device.type):  # the matmuls' dtype: K/V travel in it
            dtype = torch.get_autocast_dtype(q.device.type)
        qg = q.transpose(1, 2).reshape(B, Nk, Nq // Nk, s, q.shape[-1]).to(dtype)  # (B, Nk, g, s, H)
        k, v = (t.transpose(1, 2).to(dtype) for t in (k, v))  # (B, Nk, s, H)
        out = _RingAttention.apply(qg, k, v, self.group, self.cp_rank, self.cp_size)  # (B, Nk, g, s, Hv)
        return out.reshape(B, Nq, s, out.shape[-1]).transpose(1, 2).to(dtype)
