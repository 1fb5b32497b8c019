"""Mixture of experts: top-k router and experts stored as one batched weight per matrix.

Experts are (E, D, F) tensors so expert parallel can shard the expert dimension (dim 0).
Tokens are dispatched by sorting their (token, slot) pairs by expert id; ``GroupedExperts``
receives the sorted tokens and the count per expert, which is the seam where expert parallel
inserts its all-to-all (see meshplan.runtime.expert_parallel).
Routing follows Mixtral (Jiang et al. 2024, Sec. 2.1): softmax over the top-k router logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.runtime.models.layers import MLP, swiglu
from meshplan.spec.model import ModelSpec


def expert_mlp(x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor,
               w3: torch.Tensor | None) -> torch.Tensor:
    """Run expert e on its contiguous block of counts[e] rows. x: (T, D); w1/w3: (E, D, F); w2: (E, F, D).

    The weights are unbound once, not indexed per expert: the backward of ``w[e]`` builds a
    zero-filled gradient of the whole (E, D, F) tensor for every expert and sums them (E whole
    copies at once, found by the dry run, docs/dryrun.md); ``unbind``'s backward stacks the E
    expert gradients into one."""
    outs = []
    w1s, w2s = w1.unbind(0), w2.unbind(0)
    w3s = w3.unbind(0) if w3 is not None else None
    for e, chunk in enumerate(torch.split(x, counts, dim=0)):
        h = chunk @ w1s[e]  # (T_e, F)
        h = swiglu(h, chunk @ w3s[e]) if w3s is not None else F.gelu(h, approximate="tanh")
        outs.append(h @ w2s[e])  # (T_e, D)
    return torch.cat(outs, dim=0) if outs else x.new_zeros((0, x.shape[-1]))


class GroupedExperts(nn.Module):
    """E experts of width F: w1, w3 (E, D, F) and w2 (E, F, D)."""

    def __init__(self, num_experts: int, dim: int, hidden: int, gated: bool) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, dim, hidden)) if gated else None

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x_sorted: (T*k, D) grouped by expert id; counts: (E,) rows per expert."""
        return expert_mlp(x_sorted, counts.tolist(), self.w1, self.w2, self.w3)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass (where activation checkpointing recomputes a
    forward): the routing counter skips those, so each token is counted once per step."""
    return torch._C._current_graph_task_id() != -1


def combine_slots(out_sorted: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """Each token's k weighted expert outputs summed: (T*k, D) in expert order -> (T, D).

    Slots back in token order by a gather, then a sum over k: the backward needs the indices only.
    (``index_add`` would keep its (T*k, D) source for backward: its gradient formula expands to the
    source, torch's derivatives.yaml; one more routed-sized tensor per layer than the combine needs,
    found by the dry run, docs/dryrun.md.)"""
    slot_rows = torch.argsort(order)  # slot s (token s // k, choice s % k) is row slot_rows[s]
    return out_sorted[slot_rows].view(-1, top_k, out_sorted.shape[-1]).sum(dim=1)


class MoE(nn.Module):
    """Router + routed experts (+ always-on shared experts as one wider MLP).

    ``routed_tokens``: token copies routed to each expert by this rank's training forwards since
    the last ``take_routed_tokens`` (a bincount the routing needs anyway; runtime/routing_log.py
    reduces it over the ranks once per step). Not a buffer: checkpoints and parity are untouched."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.top_k = spec.moe_top_k
        self.router = nn.Linear(spec.hidden_size, spec.moe_num_experts, bias=False)
        self.experts = GroupedExperts(spec.moe_num_experts, spec.hidden_size,
                                      spec.moe_ffn_hidden_size, spec.gated_mlp)
        # n shared experts of width F_s sum to one MLP of width n*F_s (the hidden units are disjoint)
        self.shared = (MLP(spec.hidden_size, spec.moe_shared_experts * spec.moe_shared_ffn_hidden_size,
                           spec.gated_mlp, spec.mlp_bias) if spec.moe_shared_experts else None)
        self.routed_tokens: torch.Tensor | None = None

    def take_routed_tokens(self) -> torch.Tensor | None:
        """The counts since the last call (None if no training forward ran), and a fresh start."""
        counts, self.routed_tokens = self.routed_tokens, None
        return counts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        flat = x.reshape(B * S, D)  # (T, D)
        logits = self.router(flat)  # (T, E)
        top_logits, top_idx = logits.topk(self.top_k, dim=-1)  # (T, k)
        weights = F.softmax(top_logits.float(), dim=-1).type_as(x)
        E = logits.shape[-1]
        slot_expert = top_idx.reshape(-1)  # (T*k,)
        order = torch.argsort(slot_expert, stable=True)
        token_of_slot = order // self.top_k
        counts = torch.bincount(slot_expert, minlength=E)
        if torch.is_grad_enabled() and not _in_backward():  # training forwards, not eval nor recompute
            self.routed_tokens = counts if self.routed_tokens is None else self.routed_tokens + counts
        out_sorted = self.experts(flat[token_of_slot], counts)  # (T*k, D)
        out_sorted = out_sorted * weights.reshape(-1)[order, None]
        out = combine_slots(out_sorted, order, self.top_k)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(B, S, D)
