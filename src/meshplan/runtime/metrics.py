"""Per-step figures: model FLOPs for MFU and peak memory."""

from __future__ import annotations

import resource

import torch

from meshplan.spec.model import ModelSpec


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (non-embedding active params) + 6 x L x S x N x H attention
    score and value matmuls, causal mask halving the 12 L S D of PaLM (Chowdhery et al. 2022, App. B)."""
    dense = spec.num_params(active_only=True) - spec.embedding_params()
    if spec.tied_embeddings:
        dense += spec.vocab_size * spec.hidden_size  # the LM head matmul still runs
    attention = 6 * spec.num_layers * seq_len * spec.q_size
    return 6.0 * dense + attention


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated accelerator memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux: KiB
