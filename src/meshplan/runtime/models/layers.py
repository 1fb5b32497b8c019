"""Building blocks: norms, rotary embedding, attention (GQA), MLP (GELU or SwiGLU).

Shapes: B batch, S sequence (local to this rank), D hidden, N query heads, K key/value heads,
H head dim, F MLP width. Local head counts are read from the weights' shapes, so the same code
runs on a tensor-parallel shard (N/tp heads) without knowing about parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.spec.model import ModelSpec, Norm, Position

ROPE_THETA = 10000.0
"""RoPE base frequency (Su et al. 2021, RoFormer, Sec. 3.2.2; Llama 2 uses the same)."""
NORM_EPS = 1e-5
"""Epsilon of LayerNorm / RMSNorm (Llama and GPT-2 both use 1e-5)."""


class RMSNorm(nn.Module):
    """x / rms(x) * g (Zhang and Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Outside autocast: CUDA autocast runs rms_norm in fp32 (torch's autocast fp32 op list), i.e. an
        # fp32 copy of x saved for backward and an fp32 output (sent at 4 B by sequence parallel's
        # all-gather). Fused norms (Megatron/TE, torchtitan's FSDP2 without autocast) take the 16-bit
        # input, compute in fp32 inside the kernel and return the input's dtype: what the cost model keeps
        # (the norm's input, 2 B per element: Korthikanti et al. 2022, Sec. 4.1).
        with torch.autocast(x.device.type, enabled=False):
            return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm in its input's dtype, outside autocast (layer_norm is on CUDA autocast's fp32
    list too: see RMSNorm.forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            weight = self.weight.to(x.dtype) if self.weight is not None else None
            bias = self.bias.to(x.dtype) if self.bias is not None else None
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == Norm.RMSNORM:
        return RMSNorm(spec.hidden_size)
    return LayerNorm(spec.hidden_size, eps=NORM_EPS)


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by angle pos * theta^(-2i/H). x: (B, S, N, H); positions: (S,)."""
    H = x.shape[-1]
    inv_freq = ROPE_THETA ** (-torch.arange(0, H, 2, device=x.device, dtype=torch.float32) / H)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (S, H/2)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]  # (1, S, 1, H/2)
    xf = x.float().unflatten(-1, (H // 2, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def apply_rope_part(x: torch.Tensor, positions: torch.Tensor, rope_dim: int = 0) -> torch.Tensor:
    """RoPE on the last ``rope_dim`` channels of each head (0: all of them). Multi-head latent
    attention rotates only its decoupled d_rope part (DeepSeek-V2 Sec. 2.1.3), stored last."""
    if not rope_dim or rope_dim == x.shape[-1]:
        return apply_rope(x, positions)
    return torch.cat((x[..., :-rope_dim], apply_rope(x[..., -rope_dim:], positions)), dim=-1)


class CoreAttention(nn.Module):
    """softmax(QK^T / sqrt(H)) V with a causal mask, RoPE applied here (on the positions it sees).

    Inputs q: (B, S, Nq, H), k/v: (B, S, Nk, H) before RoPE; output (B, S, Nq, H_v) (MLA: the
value width H_v differs from the query/key width H).
    Parameter-free, so context parallel can wrap it (exchanging heads for sequence first) and
    selective recompute can checkpoint exactly this part (Korthikanti et al. 2022, Sec. 5).
    """

    def __init__(self, rope: bool, causal: bool = True, rope_dim: int = 0) -> None:
        super().__init__()
        self.rope = rope
        self.causal = causal
        self.rope_dim = rope_dim
        """Channels of each head RoPE rotates (the last ones); 0 means all."""
        self.documents: tuple[tuple[int, ...], ...] | None = None
        """Document lengths of each row of the current micro-batch (they sum to S), set by
        runtime/packing.set_documents before the forward (torchtitan sets its flex-attention block
        mask the same way, before the model runs); None: each row is one sequence."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.documents is None:
            return self._attend(q, k, v)
        # Packed documents (runtime/packing.py): each document attends only to itself, causally,
        # with positions from 0 -- the varlen path (FlashAttention's flash_attn_varlen_func), one
        # SDPA call per document, so the work follows the sum of squared lengths.
        rows = []
        for b, segments in enumerate(self.documents):
            out, start = [], 0
            for n in segments:
                out.append(self._attend(q[b:b + 1, start:start + n], k[b:b + 1, start:start + n],
                                        v[b:b + 1, start:start + n]))
                start += n
            rows.append(torch.cat(out, dim=1))
        return torch.cat(rows, dim=0)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        S = q.shape[1]
        if self.rope:
            pos = torch.arange(S, device=q.device)
            q, k = apply_rope_part(q, pos, self.rope_dim), apply_rope_part(k, pos, self.rope_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, S, H)
        # GQA: query head n uses KV head n // (Nq/Nk) (repeat_interleave semantics); SDPA shares
        # the KV heads without expanded copies, so backward keeps K/V at Nk heads.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=k.shape[1] != q.shape[1])
        return out.transpose(1, 2)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads: wq (D -> N*H), wk/wv (D -> K*H), wo (N*H -> D)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        D, H = spec.hidden_size, spec.head_dim
        self.head_dim = H
        self.wq = nn.Linear(D, spec.q_size, bias=spec.attn_bias)
        self.wk = nn.Linear(D, spec.kv_size, bias=spec.attn_bias)
        self.wv = nn.Linear(D, spec.kv_size, bias=spec.attn_bias)
        self.wo = nn.Linear(spec.q_size, D, bias=spec.mlp_bias)
        # QK-norm (Qwen3): one RMSNorm over head_dim, shared by the heads, on queries and on keys
        self.q_norm: nn.Module | None = RMSNorm(H) if spec.qk_norm else None
        self.k_norm: nn.Module | None = RMSNorm(H) if spec.qk_norm else None
        self.core = CoreAttention(rope=spec.position == Position.ROPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        H = self.head_dim
        q = self.wq(x).view(B, S, -1, H)  # (B, S, N_local, H)
        k = self.wk(x).view(B, S, -1, H)  # (B, S, K_local, H)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.wv(x).view(B, S, -1, H)
        out = self.core(q, k, v)  # (B, S, N_local, H)
        return self.wo(out.flatten(2))


SWIGLU_BACKWARD_TILE_ELEMENTS = 1 << 22
"""Elements per tile of the SwiGLU backward's fp32 math (4 Mi: 16 MiB per fp32 temporary). The
backward upcasts a, b and the incoming gradient to fp32, as silu's own backward kernel computes in
fp32 (its opmath) but inside registers; done on whole (S, F) tensors, eager torch materialises each
fp32 operand and intermediate, about seven (S, F) fp32 tensors live at once (the small FSDP plan's
dry run: "layers" +1.14 GiB over the model, bench/dryrun_fsdp_buffers.py). Row tiles bound that to
a few tiles; the math per element is the same, so the gradients are bit-identical."""


class _SwiGLU(torch.autograd.Function):
    """silu(a) * b keeping only a and b for backward and recomputing silu there, as Megatron's fused
    SwiGLU does: autograd would also keep silu(a), a third (S, F) tensor per layer."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        width = a.shape[-1]
        a2, b2, g2 = (t.reshape(-1, width) for t in (a, b, grad))
        da = torch.empty(a2.shape, dtype=a.dtype, device=a.device)
        db = torch.empty(b2.shape, dtype=b.dtype, device=b.device)
        rows = max(1, SWIGLU_BACKWARD_TILE_ELEMENTS // max(width, 1))
        for r0 in range(0, a2.shape[0], rows):
            tile = slice(r0, r0 + rows)
            # fp32 math, as silu's own backward kernel; only this tile's fp32 temporaries are live.
            a32, b32, g32 = a2[tile].float(), b2[tile].float(), g2[tile].float()
            sig = torch.sigmoid(a32)
            # d silu(a) / da = sig * (1 + a * (1 - sig))
            da[tile] = g32 * b32 * sig * (1 + a32 * (1 - sig))
            db[tile] = g32 * a32 * sig
        return da.view(a.shape), db.view(b.shape)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b (Shazeer 2020), a = x W1, b = x W3."""
    return _SwiGLU.apply(a, b)


class MLP(nn.Module):
    """GELU: w2(gelu(w1 x)); SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int, gated: bool, bias: bool) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden, bias=bias) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(swiglu(self.w1(x), self.w3(x)))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))
