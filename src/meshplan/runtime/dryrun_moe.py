"""The dry run's reference routing for MoE layers: balanced, data-independent token counts.

Routing is data-dependent (``torch.bincount`` and ``Tensor.tolist`` of the per-expert counts): fake
tensors carry shapes, not values, so the real router's counts cannot be read in a dry run. Here
every expert receives ``T*k/E`` rows (the balanced load the cost model assumes, GShard's capacity
with factor 1: Lepikhin et al. 2020, Sec. 2.2); the router still runs (its top-k and softmax
weights, and their gradient path), the experts run on their rows, and expert parallel still
issues its three all-to-alls (counts, tokens out, tokens back) on the ep group. Only the values
of the routing decision differ from a real step. Named in docs/dryrun.md.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.runtime.collectives import all_to_all, scale_grad
from meshplan.runtime.models.moe import GroupedExperts, combine_slots, expert_mlp


def balanced_counts(rows: int, experts: int) -> list[int]:
    """``rows`` split over ``experts`` as evenly as integers allow (the first ones take the rest)."""
    base, rest = divmod(rows, experts)
    return [base + (1 if e < rest else 0) for e in range(experts)]


def _moe_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """MoE.forward with slot i of the T*k (token, slot) pairs sent to expert i mod E."""
    B, S, D = x.shape
    flat = x.reshape(B * S, D)  # (T, D)
    logits = self.router(flat)  # (T, E)
    top_logits, _ = logits.topk(self.top_k, dim=-1)  # (T, k)
    weights = F.softmax(top_logits.float(), dim=-1).type_as(x)
    E = logits.shape[-1]
    slots = B * S * self.top_k
    order = torch.argsort(torch.arange(slots, device=x.device) % E, stable=True)
    token_of_slot = order // self.top_k
    out_sorted = self.experts(flat[token_of_slot], balanced_counts(slots, E))  # (T*k, D)
    out_sorted = out_sorted * weights.reshape(-1)[order, None]
    out = combine_slots(out_sorted, order, self.top_k)
    if self.shared is not None:
        out = out + self.shared(flat)
    return out.view(B, S, D)


def _etp(experts: nn.Module, run, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Wrap ``run`` in the experts' tensor-parallel f/g when the runtime's class has them."""
    etp_in, etp_out = getattr(experts, "_etp_in", None), getattr(experts, "_etp_out", None)
    if etp_in is None or etp_out is None:
        return run(x_sorted, counts)
    return etp_out(run(etp_in(x_sorted), counts))


def _local_experts_forward(self: GroupedExperts, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return _etp(self, lambda x, c: expert_mlp(x, c, self.w1, self.w2, self.w3), x_sorted, counts)


def _ep_experts_forward(self: GroupedExperts, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return _etp(self, lambda x, c: _ep_dispatch_and_run(self, x, c), x_sorted, counts)


def _ep_dispatch_and_run(self: GroupedExperts, x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """ExpertParallelExperts' dispatch with the exchanged counts known: every rank routes alike."""
    ep, E_local = self.ep_size, self.num_experts
    send_counts = torch.tensor(counts, device=x_sorted.device).view(ep, E_local)
    recv_counts = torch.empty_like(send_counts)
    torch.distributed.all_to_all_single(recv_counts, send_counts, group=self.group)
    per_rank = [sum(counts[j * E_local:(j + 1) * E_local]) for j in range(ep)]
    mine = counts[self.ep_rank * E_local:(self.ep_rank + 1) * E_local]  # my experts' rows from one rank
    recv = all_to_all(x_sorted, [per_rank[self.ep_rank]] * ep, per_rank, self.group)
    # Regroup rows from (source j, expert e) blocks to (expert e, source j), as the runtime does.
    offsets = [[j * per_rank[self.ep_rank] + sum(mine[:e]) for e in range(E_local)] for j in range(ep)]
    blocks = [torch.arange(offsets[j][e], offsets[j][e] + mine[e]) for e in range(E_local) for j in range(ep)]
    perm_t = torch.cat(blocks).to(x_sorted.device)
    w1, w2 = scale_grad(self.w1, 1.0 / ep), scale_grad(self.w2, 1.0 / ep)
    w3 = scale_grad(self.w3, 1.0 / ep) if self.w3 is not None else None
    y = expert_mlp(recv[perm_t], [c * ep for c in mine], w1, w2, w3)
    y = y[torch.argsort(perm_t)]  # back to (source, expert) order
    return all_to_all(y, per_rank, [per_rank[self.ep_rank]] * ep, self.group)


def use_balanced_routing(model: nn.Module) -> int:
    """Switch every MoE layer of ``model`` to balanced routing; returns how many were switched."""
    n = 0
    for module in model.modules():
        if type(module).__name__ == "MoE":
            module.forward = types.MethodType(_moe_forward, module)
            experts = module.experts
            fwd = _ep_experts_forward if getattr(experts, "ep_size", 1) > 1 else _local_experts_forward
            experts.forward = types.MethodType(fwd, experts)
            n += 1
    return n
