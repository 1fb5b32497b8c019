"""OSDP: per operator group, sharded or kept gathered; large operators gathered a slice at a time.

Jiang et al. 2023, "OSDP: Optimal Sharded Data Parallel for Distributed Deep Learning" (IJCAI),
Sec. 3: ZeRO-3 re-gathers every operator's parameters in forward and backward; keeping some
operators' parameters gathered (ZeRO-DP for those) saves those gathers at the price of their
whole parameters in memory, and splitting a large operator into slices bounds what is gathered at
once at the price of smaller, less efficient kernels and more collectives (Sec. 3.2). Here the
choice is per group of operators (``meshplan.plan.OpGroup``: attention, MLP, embedding, LM head)
and applies under zero 3 only (below it every parameter is kept already).

Symbols (the scaling book's): per GPU, P_a and P_m the attention and MLP parameters of one layer,
P_r the embedding / LM head parameters of the rank, n the ZeRO shards (dp_shard x cp), k the MLP
splits, c the LM-head chunks, T tokens per micro-batch, V_t the vocabulary per tp rank.

* memory: a kept group's weights are resident whole, ``P_g * w * (1 - 1/n)`` more than its shard;
  the gathered-layer buffer holds the sharded groups, the MLP ``P_m / k`` at a time; the logits
  and loss transients ``T * V_t / c`` at a time.
* time per micro-batch: the layer's two all-gathers move only the sharded groups' bytes, with one
  more collective latency per extra FSDP unit (the k MLP slices and the attention beside them); a
  kept group's updated weights are all-gathered once per step (ZeRO-2, Rajbhandari et al. 2020
  Sec. 5.2); the k slices' GEMMs at the efficiency of their narrower shape (``cost.gemm``), and
  their launches; the chunked LM head recomputes its forward in backward (no logits kept), its
  c GEMMs at their own shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.plan import OpGroup
from meshplan.spec.layers import layer_kind_counts, mixer_params
from meshplan.spec.model import ModelSpec

ATTENTION_BIT, MLP_BIT, EMBEDDING_BIT, HEAD_BIT = (g.bit for g in OpGroup)


@dataclass(frozen=True, kw_only=True)
class OsdpFactors:
    """Named factors of the OSDP model, each with its source."""

    kernel_launch_s: float = 5e-6
    """Host time to launch one CUDA kernel (the CUDA C Best Practices Guide's 'a few
    microseconds'; torch eager dispatch adds about as much): what each extra slice's kernels cost
    beyond their math when the GPU waits on the host (small slices)."""
    kernels_per_mlp_slice: int = 4
    """Kernels of one MLP slice beside its GEMMs, forward + backward: the activation function and
    its gradient, the add of the slice's partial output and of its input gradient."""
    kernels_per_head_chunk: int = 8
    """Kernels of one LM-head chunk beyond the first: its GEMM, the recomputed GEMM and the two
    backward GEMMs, the loss's softmax and gather forward and their backward (one kernel each in
    torch's fused cross-entropy)."""
    gemm_passes: float = 3.0
    """Forward + backward GEMM work over the forward's: the backward computes the input and the
    weight gradients, two GEMMs of the forward's size (Narayanan et al. 2021, Sec. 3.1)."""
    head_elementwise_passes: float = 3.0
    """Passes over the logits of the loss in forward (softmax read, write, gather), as
    ``cost.batch`` charges them for the whole LM head."""


OSDP_FACTORS = OsdpFactors()


@dataclass(frozen=True)
class OsdpCost:
    """OSDP's terms for one pipeline rank (arrays over plans, or scalars when no plan uses it)."""

    gathered_layer_params: np.ndarray | float
    """Parameters of one layer gathered at once under zero 3 (sharded groups, MLP a slice)."""
    sharded_layer_params: np.ndarray | float
    """Parameters of one layer all-gathered per micro-batch (forward and backward)."""
    sharded_rest_params: np.ndarray | float
    """The same for the rank's embedding / LM head share."""
    kept_weight_bytes: np.ndarray | float
    """Weights beyond their shards: the kept groups resident whole."""
    kept_params: np.ndarray | float
    """Parameters of the kept groups, all-gathered once per step after the update."""
    extra_gathers: np.ndarray | float
    """Collectives per gather of a layer beyond the one of an unsplit layer (k MLP slices)."""
    compute_s: np.ndarray | float
    """Per micro-batch: smaller GEMMs, slice launches and the LM head's recomputed forward."""
    logits_fraction: np.ndarray | float
    """Share of the logits (and loss transients) materialised at once: 1 / head_splits."""
    active: bool = True
    """Whether any plan uses OSDP (else every term is the plain ZeRO-3 one and callers may skip)."""


def uses_osdp(plans) -> bool:
    """Whether any plan keeps a group gathered or splits an operator."""
    return bool(plans.keep.any() or plans.mlp_splits.max(initial=1) > 1 or plans.head_splits.max(initial=1) > 1)


def attention_params_per_layer(model: ModelSpec) -> float:
    """The token mixer and its pre-norm of the average layer (before tp)."""
    kinds = layer_kind_counts(model)
    return sum((mixer_params(model, kind.mixer) + model.norm_params()) * n for kind, n in kinds) / model.num_layers


def rank_osdp(model: ModelSpec, plans, calib: Calibration, *, layer_params, dense_layer_params, layers,
              rest_params, embed_params, head_params, head_share, tokens, vocab_per_gpu, linear_flops, head_flops,
              hbm_bytes_per_s, activation_bytes, active: bool | None = None,
              factors: OsdpFactors = OSDP_FACTORS) -> OsdpCost:
    """OSDP terms of one pipeline rank (see the module docstring); the arguments per GPU, after
    tp: ``layer_params`` of the average layer (``dense_layer_params`` of it not experts),
    ``rest_params`` the rank's embedding + LM head of which ``embed_params`` / ``head_params``;
    ``head_share`` the part of the LM head's work this rank does (0 or 1; 1/pp with vocabulary
    parallelism); ``active`` is ``uses_osdp(plans)`` when the caller has it."""
    if not (uses_osdp(plans) if active is None else active):
        return OsdpCost(gathered_layer_params=layer_params, sharded_layer_params=layer_params,
                        sharded_rest_params=rest_params, kept_weight_bytes=0.0, kept_params=0.0,
                        extra_gathers=0.0, compute_s=0.0, logits_fraction=1.0, active=False)
    z3 = plans.zero == 3
    keep = np.where(z3, plans.keep, 0)
    k = plans.mlp_splits.astype(float)
    t = plans.tp.astype(float)
    attn = np.minimum(attention_params_per_layer(model) / t, dense_layer_params)
    mlp = layer_params - attn
    attn_kept, mlp_kept = (keep & ATTENTION_BIT) > 0, (keep & MLP_BIT) > 0
    sharded_attn = np.where(attn_kept, 0.0, attn)
    sharded_mlp = np.where(mlp_kept, 0.0, mlp)
    kept_layer = layer_params - sharded_attn - sharded_mlp
    kept_rest = (np.where((keep & EMBEDDING_BIT) > 0, embed_params, 0.0)
                 + np.where((keep & HEAD_BIT) > 0, head_params, 0.0))
    kept = layers * kept_layer + kept_rest
    # Resident whole instead of a 1/n shard (experts: their own, smaller shard count; charged
    # at the dense one, an upper bound on what keeping them costs).
    n1 = (plans.dp_shard * plans.cp).astype(float)
    kept_bytes = kept * calib.weight_bytes_per_param * (1.0 - 1.0 / n1)
    # One FSDP unit per layer today; split, the k MLP slices and the attention beside them.
    units = np.where(k > 1, k + (sharded_attn > 0), 1.0)
    extra_gathers = np.where(z3 & (sharded_attn + sharded_mlp > 0), units - 1.0, 0.0)

    # ---- compute: the MLP's GEMMs in k narrower slices, their launches (dense MLP only) -----
    F = float(model.ffn_hidden_size) / t
    D = float(model.hidden_size)
    up = 2.0 if model.gated_mlp else 1.0  # w1 (and w3) D -> F, then w2 F -> D
    whole = gemm_time(calib, linear_flops, tokens, up * F, D) + gemm_time(calib, linear_flops, tokens, D, F)
    sliced = k * (gemm_time(calib, linear_flops, tokens, up * F / k, D)
                  + gemm_time(calib, linear_flops, tokens, D, F / k))
    launches = (k - 1.0) * (factors.gemm_passes * (up + 1.0) + factors.kernels_per_mlp_slice) * factors.kernel_launch_s
    mlp_extra = layers * np.where(k > 1, factors.gemm_passes * (sliced - whole) + launches, 0.0)

    # ---- the chunked LM head: c GEMMs of T/c tokens, the forward again in backward ----------
    c = plans.head_splits.astype(float)
    head_whole = gemm_time(calib, head_flops, tokens, vocab_per_gpu, D)
    chunk = gemm_time(calib, head_flops, tokens / c, vocab_per_gpu, D)
    loss_pass = factors.head_elementwise_passes * tokens * vocab_per_gpu * activation_bytes / hbm_bytes_per_s
    head_chunked = (factors.gemm_passes + 1.0) * (c * chunk + loss_pass)
    head_extra = np.where(c > 1, head_chunked - factors.gemm_passes * (head_whole + loss_pass)
                          + (c - 1.0) * factors.kernel_launch_s * factors.kernels_per_head_chunk, 0.0)
    return OsdpCost(
        gathered_layer_params=sharded_attn + sharded_mlp / k,
        sharded_layer_params=np.where(z3, sharded_attn + sharded_mlp, layer_params),
        sharded_rest_params=np.maximum(rest_params - kept_rest, 0.0),
        kept_weight_bytes=np.where(z3, kept_bytes, 0.0), kept_params=np.where(z3, kept, 0.0),
        extra_gathers=extra_gathers, compute_s=mlp_extra + head_share * head_extra,
        logits_fraction=1.0 / c)


def extra_gather_latency_s(extra_gathers, shards, link: comms.Link):
    """The ring latency of ``extra_gathers`` more all-gathers over ``shards`` ranks ((n-1) alpha each)."""
    alpha, _ = link.rates("all_gather")
    return extra_gathers * (np.asarray(shards, dtype=float) - 1.0) * alpha


__all__ = ["OsdpFactors", "OSDP_FACTORS", "OsdpCost", "uses_osdp", "rank_osdp", "attention_params_per_layer",
           "extra_gather_latency_s"]
