"""Expert parallel: each of the ep ranks owns E/ep experts; tokens travel to their owner and back.

Dispatch (GShard, Lepikhin et al. 2020, Sec. 2.2; torchtitan's token dispatcher): the MoE layer
hands over its (token, slot) rows sorted by global expert id with the count per expert. Ranks first
exchange the counts, then one all-to-all sends every row to the rank owning its expert; the owner
regroups them by local expert, runs its experts, and a second all-to-all brings the rows home in
their original order. Both all-to-alls carry gradients (collectives.all_to_all).

Gradient scale: an expert's weight gradient is the sum of the contributions of all ep ranks'
tokens, while data-parallel averaging of the experts (over the edp ranks that hold the same
experts) divides by dp*cp/ep only; scaling the expert weights' gradient by 1/ep makes the total
the global mean, the same as one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshplan.runtime.collectives import all_to_all, scale_grad
from meshplan.runtime.models.moe import GroupedExperts, expert_mlp


class ExpertParallelExperts(GroupedExperts):
    """GroupedExperts holding experts [ep_rank*E/ep, (ep_rank+1)*E/ep) of the full set."""

    def __init__(self, full: GroupedExperts, group: dist.ProcessGroup, ep_rank: int, ep_size: int) -> None:
        E, D, F = full.w1.shape
        with torch.device(full.w1.device):
            super().__init__(E // ep_size, D, F, full.w3 is not None)
        self.num_global_experts = E
        self.group, self.ep_rank, self.ep_size = group, ep_rank, ep_size

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, E_local = self.ep_size, self.num_experts
        send_counts = counts.view(ep, E_local)  # [j, e]: my rows for expert e of rank j
        recv_counts = torch.empty_like(send_counts)  # [j, e]: rank j's rows for my expert e
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        in_splits = send_counts.sum(1).tolist()
        out_splits = recv_counts.sum(1).tolist()
        recv = all_to_all(x_sorted, out_splits, in_splits, self.group)  # grouped (source j, expert e)

        # Regroup rows from (source j, expert e) blocks to (expert e, source j) blocks.
        rc = recv_counts.tolist()
        offsets, start = [[0] * E_local for _ in range(ep)], 0
        for j in range(ep):
            for e in range(E_local):
                offsets[j][e], start = start, start + rc[j][e]
        blocks = [torch.arange(offsets[j][e], offsets[j][e] + rc[j][e]) for e in range(E_local) for j in range(ep)]
        perm_t = torch.cat(blocks).to(x_sorted.device)
        per_expert = [sum(rc[j][e] for j in range(ep)) for e in range(E_local)]
        w1, w2 = scale_grad(self.w1, 1.0 / ep), scale_grad(self.w2, 1.0 / ep)
        w3 = scale_grad(self.w3, 1.0 / ep) if self.w3 is not None else None
        y = expert_mlp(recv[perm_t], per_expert, w1, w2, w3)
        y = y[torch.argsort(perm_t)]  # back to (source, expert) order
        return all_to_all(y, in_splits, out_splits, self.group)

