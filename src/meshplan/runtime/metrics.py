"""Per-step figures: peak memory. (Model FLOPs for MFU: ``meshplan.cost.flops.model_flops_per_token``,
the one count the cost model's predicted MFU uses too.)"""

from __future__ import annotations

import resource

import torch


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated accelerator memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux: KiB
