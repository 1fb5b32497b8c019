"""Op-level selective recompute: what a layer keeps when a stack saves chosen ops' outputs.

Megatron-Core's selective recompute (Korthikanti et al. 2022, Sec. 5) recomputes the attention
core only and keeps every other activation (``cost/layer.py``, ``act_selective_bytes``).
torchtitan's ``selective_ac_option = "op"`` (torchtitan ``activation_checkpoint.py``, the policy
its performance tables ran with; ``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
wraps each transformer block in a non-reentrant checkpoint and, inside it, saves the outputs of

* every other ``aten.mm`` of the block, counted from 1 in forward order (the 1st, 3rd, 5th, ...:
  "saves output of all compute ops, except every second mm"); the counter restarts per block;
* the fused attention kernel (``_scaled_dot_product_{flash,efficient}_attention``): its output
  and its fp32 log-sum-exp, one per head and token;
* the sequence-parallel ``reduce_scatter_tensor`` (the row-parallel linears' outputs under SP);
* ``aten.max`` (fp8 amax scalars: nothing per token).

Everything else is recomputed, so the block keeps its input (the checkpoint's) plus those
outputs. Saved mm outputs are in the compute dtype also under torchao's Float8 linears: the
policy sees the ``aten.mm`` of the Float8 tensor subclass (modes dispatch before subclasses)
and its output is bf16. The expert grouped GEMMs (``aten._grouped_mm``) are not in the list.

A block's mm order: the mixer's projections (torchtitan's Llama: wq, wk, wv, wo; MLA: the down
projections, q up, kv up, wo; Mamba-2: in_proj, out_proj), then the channel mixer's (dense: w1,
w3, w2 -- SwiGLU ``w2(silu(w1(x)) * w3(x))``; MoE: the router, then the shared experts' w1, w3,
w2 as one MLP). Symbols: T tokens of the micro-batch on this GPU (b*S/cp), t the tp degree, D the hidden size;
a tp-sharded mm sees all T tokens (SP gathers them) and writes its width / t, a row-parallel one
writes T x D partial sums (DTensor's Partial placement) before its reduce-scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.spec.layers import Ffn, LayerKind, Mixer, mamba_in_proj_width, mamba_inner
from meshplan.spec.model import ModelSpec

LSE_BYTES_PER_ELEMENT = 4.0
"""The attention kernel's log-sum-exp is fp32 (FlashAttention-2, Dao 2023, Algorithm 1 output L)."""


@dataclass(frozen=True)
class OpSelective:
    """One layer under the op-level policy, arrays over plans."""

    kept_bytes: np.ndarray
    """Kept for the backward per micro-batch: the block input and the saved ops' outputs."""
    mixer_recomputed_share: np.ndarray | float
    """Of the token mixer's projection FLOPs, the share recomputed (its even-numbered mms)."""
    ffn_recomputed_share: np.ndarray | float
    """Of the channel mixer's GEMM FLOPs, the share recomputed (dense: its even-numbered mms;
    MoE: 1, the experts' grouped GEMMs are not saved and they dominate the block)."""


def _every_other(widths: list) -> np.ndarray | float:
    """Sum of the 1st, 3rd, 5th, ... mm output widths of a block (the policy's odd counts)."""
    return sum(widths[0::2], 0.0)


def _even_share(mms: list) -> np.ndarray | float:
    """FLOPs share (out x in per token) of the 2nd, 4th, ... of ``mms`` ((out, in) pairs), counted
    from 1 within the block; ``mms`` is a slice of the block starting at an odd count."""
    total = sum((o * i for o, i in mms), 0.0)
    return sum((o * i for o, i in mms[1::2]), 0.0) / total if mms else 0.0


def op_selective(model: ModelSpec, kind: LayerKind, *, tokens, tokens_replicated, tp, sp,
                 ab: float) -> OpSelective:
    """One layer for one micro-batch under the op-level policy (arrays over plans).

    ``tokens``: T = b*S/cp on this GPU; ``tokens_replicated``: what the replicated ops see
    (T/t with sequence parallelism); ``tp``: t; ``sp``: sequence parallel per plan;
    ``ab``: bytes per activation element (the mm outputs' dtype)."""
    T, t = tokens, tp
    D = float(model.hidden_size)
    mms: list = []  # (output width, input width) per token of each mm, in forward order
    kernel = 0.0 * T  # attention kernel output + log-sum-exp, bytes per token
    heads_local = float(model.num_heads) / t
    if kind.mixer == Mixer.MAMBA:
        mms += [(mamba_in_proj_width(model) / t, D), (D, mamba_inner(model) / t)]
    elif kind.mixer != Mixer.NONE:
        if model.is_mla:
            q_lora, kv_lora = float(model.q_lora_rank), float(model.kv_lora_rank)
            mms += [(q_lora + kv_lora + model.qk_rope_head_dim, D)]  # down projections (replicated)
            if model.q_lora_rank:
                mms += [(heads_local * model.qk_head_dim, q_lora)]
            mms += [(heads_local * (model.qk_nope_head_dim + model.v_dim), kv_lora)]
        else:
            kv_local = np.maximum(model.num_kv_heads / t, 1.0) * model.head_dim
            mms += [(model.q_size / t, D), (kv_local, D), (kv_local, D)]  # wq, wk, wv
        mms += [(D, heads_local * model.v_dim)]  # wo (partial sums when t > 1)
        kernel = heads_local * (model.v_dim * ab + LSE_BYTES_PER_ELEMENT)
    n_mixer_mm = len(mms)
    gated = 2 if model.gated_mlp else 1  # w1 (and w3) before w2
    if kind.ffn == Ffn.DENSE:
        F = model.ffn_hidden_size / t
        mms += [(F, D)] * gated + [(D, F)]
    elif kind.ffn == Ffn.MOE:
        mms += [(float(model.moe_num_experts), D)]  # router logits (replicated)
        if model.moe_shared_experts:  # the shared experts run as one MLP of their summed width
            shared = model.moe_shared_experts * model.moe_shared_ffn_hidden_size / t
            mms += [(shared, D)] * gated + [(D, shared)]
    saved_mm = _every_other([o for o, _ in mms]) * T * ab
    # Under SP each row-parallel output (wo, w2, the shared experts' w2) is reduce-scattered,
    # and that output saved too; without SP it is all-reduced (not in the list).
    ffn_rows = kind.ffn == Ffn.DENSE or (kind.ffn == Ffn.MOE and model.moe_shared_experts > 0)
    row_parallel = (1 if n_mixer_mm else 0) + (1 if ffn_rows else 0)
    scattered = np.where(sp & (t > 1), row_parallel * T / t * D * ab, 0.0)
    block_input = tokens_replicated * D * ab
    ffn = mms[n_mixer_mm:]
    # the block's counts run on from the mixer into the channel mixer: an even mixer count starts it odd
    ffn_share = 1.0 if kind.ffn == Ffn.MOE else (_even_share(ffn) if n_mixer_mm % 2 == 0
                                                  else 1.0 - _even_share(ffn) if ffn else 0.0)
    return OpSelective(kept_bytes=block_input + saved_mm + T * kernel + scattered,
                       mixer_recomputed_share=_even_share(mms[:n_mixer_mm]), ffn_recomputed_share=ffn_share)
