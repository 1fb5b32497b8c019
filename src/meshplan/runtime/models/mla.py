"""Multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024, Sec. 2.1; used by V3 and Kimi-K2).

Shapes: B batch, S sequence, D hidden, N heads (local N/tp on a tensor-parallel shard, read from
the weights), d_c = kv_lora_rank, d_c' = q_lora_rank, d_n = qk_nope_head_dim, d_r =
qk_rope_head_dim, d_v = v_head_dim.

    c_q = norm(W^DQ x)                      (B, S, d_c')         (W^Q x when q_lora_rank is 0)
    q   = W^UQ c_q -> (B, S, N, d_n + d_r)  nope part first, rope part last
    [c_kv, k_r] = W^DKV x                   (B, S, d_c + d_r)    k_r: ONE rope key for all heads
    [k_n, v] = W^UKV norm(c_kv) -> (B, S, N, d_n + d_v)
    k   = [k_n, k_r broadcast over heads]   (B, S, N, d_n + d_r)
    out = W^O attention(q, k, v)            RoPE on the last d_r channels of q and k only

The down projections and their norms are small and replicated over tensor-parallel ranks (as in
Megatron-LM's MLA); W^UQ, W^UKV split by head, W^O by row. ``k_rope_sync`` is where the runtime
sums the gradient of the shared rope key over the tensor-parallel ranks (each holds some heads).
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.runtime.models.layers import CoreAttention, RMSNorm
from meshplan.spec.model import ModelSpec


class LatentAttention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        D, N = spec.hidden_size, spec.num_heads
        self.nope, self.rope_dim, self.v_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.kv_lora = spec.kv_lora_rank
        self.head_dim = self.nope + self.rope_dim  # query/key width per head
        if spec.q_lora_rank:
            self.wq_a: nn.Linear | None = nn.Linear(D, spec.q_lora_rank, bias=False)
            self.q_norm: nn.Module | None = RMSNorm(spec.q_lora_rank)
            self.wq_b = nn.Linear(spec.q_lora_rank, N * self.head_dim, bias=False)
        else:
            self.wq_a, self.q_norm = None, None
            self.wq_b = nn.Linear(D, N * self.head_dim, bias=False)
        self.wkv_a = nn.Linear(D, self.kv_lora + self.rope_dim, bias=False)
        self.kv_norm = RMSNorm(self.kv_lora)
        self.wkv_b = nn.Linear(self.kv_lora, N * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(N * self.v_dim, D, bias=spec.mlp_bias)
        self.k_rope_sync: nn.Module = nn.Identity()
        self.core = CoreAttention(rope=True, rope_dim=self.rope_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        c_q = self.q_norm(self.wq_a(x)) if self.wq_a is not None else x
        q = self.wq_b(c_q).view(B, S, -1, self.head_dim)  # (B, S, N_local, d_n + d_r)
        c_kv, k_rope = self.wkv_a(x).split([self.kv_lora, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(c_kv)).view(B, S, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)  # (B, S, N_local, d_n), (.., d_v)
        k_rope = self.k_rope_sync(k_rope)[:, :, None, :].expand(-1, -1, q.shape[2], -1)
        k = torch.cat((k_nope, k_rope), dim=-1)  # (B, S, N_local, d_n + d_r)
        out = self.core(q, k, v.contiguous())  # (B, S, N_local, d_v)
        return self.wo(out.flatten(2))
