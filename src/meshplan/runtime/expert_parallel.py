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

from meshplan.runtime.collectives import (
    all_reduce_forward,
    all_reduce_grad,
    all_to_all,
    scale_grad,
)
from meshplan.runtime.models.moe import GroupedExperts, expert_mlp

ETP_DIMS = {"w1": 2, "w3": 2, "w2": 1}
"""Dimension of each expert weight that expert tensor parallel splits: F (w1, w3: (E, D, F);
w2: (E, F, D)). Read by models/init.py and state.py to draw and gather the full tensors."""


class _ExpertTensorParallel:
    """Megatron's expert tensor parallel (Shoeybi et al. 2019 Sec. 3 applied to each expert):
    every tp rank holds an F/tp slice of every expert, sees the same (replicated) tokens and
    computes a partial output; ``f`` (identity, gradient all-reduced) before and ``g`` (all-reduce,
    identity backward) after. Here the expert tensor-parallel group is the tp group."""

    etp_group: dist.ProcessGroup | None = None
    etp_rank: int = 0
    etp_size: int = 1
    etp_dims = ETP_DIMS

    def _etp_in(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_grad(x, self.etp_group) if self.etp_size > 1 else x

    def _etp_out(self, y: torch.Tensor) -> torch.Tensor:
        return all_reduce_forward(y, self.etp_group) if self.etp_size > 1 else y


class ExpertTensorParallelExperts(_ExpertTensorParallel, GroupedExperts):
    """GroupedExperts holding the F/tp slice ``etp_rank`` of every expert."""

    def __init__(self, full: GroupedExperts, group: dist.ProcessGroup, tp_rank: int, tp_size: int) -> None:
        E, D, F = full.w1.shape
        with torch.device(full.w1.device):
            GroupedExperts.__init__(self, E, D, F // tp_size, full.w3 is not None)
        self.etp_group, self.etp_rank, self.etp_size = group, tp_rank, tp_size

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self._etp_out(GroupedExperts.forward(self, self._etp_in(x_sorted), counts))


class ExpertParallelExperts(_ExpertTensorParallel, GroupedExperts):
    """GroupedExperts holding experts [ep_rank*E/ep, (ep_rank+1)*E/ep) of the full set (and, when
    ``full`` is expert-tensor-parallel, the same F slice of each)."""

    def __init__(self, full: GroupedExperts, group: dist.ProcessGroup, ep_rank: int, ep_size: int) -> None:
        E, D, F = full.w1.shape
        with torch.device(full.w1.device):
            GroupedExperts.__init__(self, E // ep_size, D, F, full.w3 is not None)
        self.num_global_experts = E
        self.group, self.ep_rank, self.ep_size = group, ep_rank, ep_size
        self.etp_group = getattr(full, "etp_group", None)
        self.etp_rank, self.etp_size = getattr(full, "etp_rank", 0), getattr(full, "etp_size", 1)

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self._etp_out(self._dispatch_and_run(self._etp_in(x_sorted), counts))

    def _dispatch_and_run(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
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

