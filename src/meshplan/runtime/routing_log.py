"""The routing log: every step, the token copies each expert of each MoE layer received, summed
over all ranks, and the measured imbalance (busiest expert over the mean, per layer).

Each MoE layer counts its own rank's routed copies (``MoE.routed_tokens``, a bincount); once per
step one all-reduce of a (MoE layers x E) integer tensor over the world sums them: data-parallel
and context-parallel ranks route different tokens, pipeline stages own different layers (zeros
elsewhere), tensor-parallel ranks route the same tokens (so the sum is divided by tp). With a
pipeline, the process's first step is not logged: torch's schedule runs one extra forward per
stage on that step to infer the shapes its stages exchange, which would count one micro-batch
twice. Rank 0
appends one line per step to the log that ``meshplan estimate --expert-load`` reads back
(format: meshplan.spec.expert_load).
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from meshplan.spec.expert_load import log_header
from meshplan.spec.model import ModelSpec


def moe_layer_ids(spec: ModelSpec) -> list[int]:
    """Global ids of the MoE layers (after the leading dense ones)."""
    return list(range(spec.moe_dense_layers, spec.num_layers)) if spec.is_moe else []


class RoutingLog:
    """Per-step expert counts of ``modules`` (this rank's model parts); ``path`` written by rank 0."""

    def __init__(self, spec: ModelSpec, modules: list[torch.nn.Module], *, tp: int, pp: int,
                 device: torch.device, path: str | None) -> None:
        self.ids = moe_layer_ids(spec)
        self.row = {layer_id: i for i, layer_id in enumerate(self.ids)}
        self.num_experts, self.tp, self.device = spec.moe_num_experts, tp, device
        # Model parts without blocks (a vocabulary-parallel rank's embedding / head shards) route nothing.
        self.layers = [(int(name), block.moe) for m in modules for name, block in getattr(m, "layers", {}).items()
                       if getattr(block, "moe", None) is not None]
        self.skip_next = pp > 1  # the pipeline's shape-inference step (module docstring)
        self.file = None
        if path and self.ids and dist.get_rank() == 0:
            self.file = open(path, "w")
            self.file.write(json.dumps(log_header(spec.moe_num_experts, spec.moe_top_k, len(self.ids))) + "\n")
            self.file.flush()

    @property
    def active(self) -> bool:
        return bool(self.ids)

    def collect(self, step: int) -> list[float] | None:
        """Sum the step's counts over the ranks (a collective: every rank calls it), log them on
        rank 0, and return the per-layer imbalance (max/mean); None for a model without MoE and
        for a pipeline's first step."""
        if not self.ids:
            return None
        if self.skip_next:
            self.skip_next = False
            for _, moe in self.layers:
                moe.take_routed_tokens()
            return None
        counts = torch.zeros(len(self.ids), self.num_experts, dtype=torch.int64, device=self.device)
        for layer_id, moe in self.layers:
            taken = moe.take_routed_tokens()
            if taken is not None:
                counts[self.row[layer_id]] += taken.to(torch.int64)
        dist.all_reduce(counts)
        counts = (counts // self.tp).tolist()
        if self.file:
            self.file.write(json.dumps({"step": step, "counts": counts}) + "\n")
            self.file.flush()
        return [max(c) * len(c) / sum(c) if sum(c) else 0.0 for c in counts]

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
