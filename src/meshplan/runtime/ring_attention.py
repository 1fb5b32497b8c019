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

from meshplan.ring_policy import QUERY_CHUNK_ROWS
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


def _scores(q: torch.Tensor, k: torch.Tensor, row0: int, diagonal: bool) -> torch.Tensor:
    """Scaled fp32 scores (B, Nk, g, c, t) of a query tile q (B, Nk, g, c, H) starting at row
    ``row0`` and keys k (B, Nk, t, H): the g query heads of a GQA group share their KV head by
    broadcasting, never by a copy. On the diagonal block, key j is masked for query row i < j."""
    c, t = q.shape[-2], k.shape[-2]
    # In place on the product: one (c, t) fp32 tile per head, not a second for the scaled copy.
    scores = (q.float() @ k.float().unsqueeze(2).transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))
    if diagonal:
        rows = torch.arange(row0, row0 + c, device=q.device)
        mask = torch.arange(t, device=q.device)[None, :] > rows[:, None]
        scores.masked_fill_(mask, float("-inf"))
    return scores


def _tiles(s: int, diagonal: bool) -> list[tuple[int, int, int]]:
    """(first row, last row + 1, keys seen) per query tile; on the diagonal a tile sees keys < its end."""
    return [(r, min(r + QUERY_CHUNK_ROWS, s), min(r + QUERY_CHUNK_ROWS, s) if diagonal else s)
            for r in range(0, s, QUERY_CHUNK_ROWS)]


def _block_forward(q, kb, vb, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """This block's softmax output (B, Nk, g, s, Hv) and log-sum-exp (B, Nk, g, s), tile by tile."""
    outs, lses = [], []
    for r0, r1, t in _tiles(q.shape[-2], diagonal):
        sc = _scores(q[..., r0:r1, :], kb[..., :t, :], r0, diagonal)
        lses.append(torch.logsumexp(sc, dim=-1))
        outs.append(torch.softmax(sc, dim=-1) @ vb[..., :t, :].float().unsqueeze(2))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def _block_backward(q, kb, vb, dout, lse, delta, diagonal: bool):
    """dQ (B, Nk, g, s, H) and this block's dK, dV (B, Nk, s, H), summed over the g heads, fp32."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(kb.shape, dtype=torch.float32, device=kb.device)
    dv = torch.zeros(vb.shape, dtype=torch.float32, device=vb.device)
    for r0, r1, t in _tiles(q.shape[-2], diagonal):
        qt, do = q[..., r0:r1, :], dout[..., r0:r1, :]
        k, v = kb[..., :t, :].float().unsqueeze(2), vb[..., :t, :].float().unsqueeze(2)
        # Two (c, t) fp32 tiles per head at most (BACKWARD_LIVE_TILES): P, then dS made in place
        # on dO V^T; the same values as the out-of-place expressions, bit for bit.
        p = _scores(qt, kb[..., :t, :], r0, diagonal).sub_(lse[..., r0:r1].unsqueeze(-1)).exp_()
        dv[..., :t, :] += (p.transpose(-1, -2) @ do).sum(2)
        ds = (do @ v.transpose(-1, -2)).sub_(delta[..., r0:r1, :]).mul_(p)
        del p
        dq[..., r0:r1, :] = (ds @ k) * scale
        dk[..., :t, :] += (ds.transpose(-1, -2) @ qt.float()).sum(2) * scale
        del ds  # before the next tile's scores, else a third tile is live
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    """q: (B, Nk, g, s, H) grouped by KV head; k, v: (B, Nk, s, H), the KV heads themselves, in the
    compute dtype: what travels around the ring is the un-expanded K/V of the cost model (2 s Nk H
    elements per hop). Softmax statistics, output and gradients are accumulated in fp32.

    The output is returned, and kept for backward, as one tensor laid out (B, s, Nk, g, Hv): the
    token-major layout the output projection reads (B, s, Nq Hv) as a view, as FlashAttention's
    kernel writes O (B, S, N, H) in memory. Kept head-major, the projection's ``flatten`` copied it,
    a second O per layer kept for wo's weight gradient (the dry run's ``attention / aten.clone``,
    2.44 GiB on the README plan's rank 0, docs/dryrun.md)."""

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
                blk_out, blk_lse = _block_forward(q, kb, vb, diagonal=j == rank)
                new_lse = torch.logaddexp(lse, blk_lse)
                out = out * torch.exp(lse - new_lse).unsqueeze(-1) + blk_out * torch.exp(blk_lse - new_lse).unsqueeze(-1)
                lse = new_lse
            if step < size - 1:
                kb, vb = _ring_pass([kb, vb], group, rank, size)
        # Kept for backward in the compute dtype, as FlashAttention keeps O, token-major (see above).
        out = out.permute(0, 3, 1, 2, 4).to(q.dtype, memory_format=torch.contiguous_format)  # (B, s, Nk, g, Hv)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.rank, ctx.size = group, rank, size
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, rank, size = ctx.group, ctx.rank, ctx.size
        out = out.permute(0, 2, 3, 1, 4)  # (B, Nk, g, s, Hv), a view
        dout = dout.float().permute(0, 2, 3, 1, 4).contiguous()
        delta = (dout * out.float()).sum(-1, keepdim=True)  # (B, Nk, g, s, 1): rowsum(dO * O)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kb, vb = k, v
        # dK/dV of the travelling block, summed over the g query heads of each KV head, in fp32.
        dkb = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dvb = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for step in range(size):
            j = (rank - step) % size
            if j <= rank:
                bq, bk, bv = _block_backward(q, kb, vb, dout, lse, delta, diagonal=j == rank)
                dq, dkb, dvb = dq + bq, dkb + bk, dvb + bv
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
        out = _RingAttention.apply(qg, k, v, self.group, self.cp_rank, self.cp_size)  # (B, s, Nk, g, Hv)
        return out.reshape(B, s, Nq, out.shape[-1])  # a view: wo's flatten copies nothing
