"""MoE-as-it-runs factors of :class:`~meshplan.cost.calibration.Calibration` (read by
cost/moe.py): permutation passes, routing imbalance, grouped GEMMs, dispatch sync.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MoEFields"]


@dataclass(frozen=True, kw_only=True)
class MoEFields:
    """Token permutation, routing imbalance, grouped expert GEMMs and dispatch sync."""

    moe_permute_passes: float = 1.0
    """HBM passes of the token permutation before the experts and the un-permutation (with the
    routing-probability weighting) after them: each reads and writes every routed token copy
    once (Megatron-Core / TE fused moe_permute / moe_unpermute kernels)."""
    moe_routing_imbalance: float = 1.0
    """Routed tokens of the busiest expert-parallel rank over the mean: 1 with force-balanced
    routing (Megatron --moe-router-force-load-balancing; the Megatron-Bridge benchmark rows);
    natural routing with an auxiliary loss stays 1.1-1.5x off balance per step (Fedus et al.
    2022, Switch Transformer Sec. 2.2; DeepSeek-V3 Sec. 2.1.2). The step waits for the busiest."""
    moe_grouped_gemm_half_dim: float = 128.0
    """matmul_half_dim of the experts' grouped GEMMs: the efficiency curve of cost/gemm.py with
    this half dimension, seen by the tokens per expert (the m of each group member) and the
    expert widths. A grouped GEMM (TE/cuBLASLt grouped GEMM, CUTLASS grouped kernels) pays a
    partial wave per expert and cannot pick one tile shape for all members, so its falloff with
    small per-expert batches is steeper than a single GEMM's (Megatron-Core MoE docs, 'grouped
    GEMM': efficiency grows with tokens per expert). Default: the dense GEMM's 128 (no extra
    falloff); fitted per (generation, stack)."""
    moe_grouped_gemm_efficiency: float = 1.0
    """Large-shape efficiency of the experts' grouped GEMMs over a single GEMM's
    ``matmul_efficiency``: TE's GroupedLinear runs the local experts' GEMMs as a sequence of
    cuBLASLt calls (general_grouped_gemm over the m_splits), each with its own fp8 casts and
    scaling epilogue, that a dense GEMM of the layer does not pay. A MoE-only constant, so that
    dense rows never pay a cost fitted on MoE rows, nor MoE rows move the dense GEMM efficiency
    (bench/bench_holdout_drift.py). Default 1: no difference; fitted per (generation, stack) on
    the MoE rows; not applied to one fused grouped kernel (``moe_fused_grouped_mlp``)."""
    moe_alltoall_sync_s: float = 1.0e-3
    """Host time to launch a MoE layer's forward after the dropless all-to-all dispatcher's
    device-to-host sync of the tokens-per-expert counts (the backward, like all of the layer's
    work, 2x). Megatron-Core's MoEAlltoAllTokenDispatcher and torchtitan's expert-parallel
    all-to-all move the counts to the host to size the all-to-all: the launch queue drains,
    and the layer's remaining ~100 kernels (permute, grouped GEMMs, activation, unpermute,
    combine) start from the host at ~10 us of launch and dispatch each (5-20 us: PyTorch blog
    'Accelerating PyTorch with CUDA Graphs', 2021). Host and device then run concurrently up to
    the next MoE layer's sync, the host launching this layer's experts and the next layer's norm,
    attention and router: a MoE layer's forward takes max(its device time, this launch time)
    (cost/layer.py): a small, fine-grained MoE at micro-batch 1 is host-bound, a large one hides
    the launches behind its GEMMs. 0 with CUDA graphs / a sync-free dispatcher; fitted per stack."""
    moe_expert_gemm_s: float = 0.0
    """Fixed device time of each local expert's GEMM beyond its FLOPs, forward, per GEMM (two per
    expert: up and down; the backward 2x like all of the layer's work): Transformer Engine's
    GroupedLinear (Megatron-Core --moe-grouped-gemm) runs one GEMM per local expert
    (general_grouped_gemm over the m_splits, with each split's fp8 cast), each with its launch and
    its last partial wave, so a layer with E/ep local experts pays 2 E/ep of them whatever the
    tokens: many small local experts (ep 8 of 128) cost more than few large ones. 0: a single
    grouped kernel; fitted per (generation, stack)."""
