"""FLOP counts: model FLOPs for MFU, and the formulas published runs used for their TFLOP/s.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, Appendix B; torchtitan's convention):
    6 * N + 12 * L * S * q
N = parameters that do matmuls for one token (all active parameters except the input embedding
and learned position tables, which are lookups; an untied or tied LM head counts once), the
12*L*S*q term is attention's QK^T and AV (2 matmuls x 2 FLOPs x 3 for fwd+bwd x S x q per layer),
counted without the causal halving, as published MFU figures do. For GPT-3 175B at S=2048 it is
6 * 174.6e9 + 12 * 96 * 2048 * 12288 = 1.076e12 FLOPs per token.

Generalised per layer (spec/layers.py): 12*S*q is 6 * S * N * (d_qk + d_v), the QK^T and AV
widths; MLA uses its own (d_nope + d_rope, d_v); a sliding-window layer attends to
min(window, S) keys; a Mamba-2 layer's SSD scan and conv add 6 * (G*Q*N_s + n*Q*P + 2*n*N_s*P
+ W*channels) (Dao & Gu 2024 Sec. 6, see cost/mixers.py); a multi-token-prediction module adds
its block and one more pass of the (shared) LM head, 6 * V * D.
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.spec.layers import (LayerKind, Mixer, layer_kind_counts, mamba_conv_channels, mtp_kind)
from meshplan.spec.model import Arch, ModelSpec


def matmul_params(model: ModelSpec) -> int:
    """Active parameters that take part in matmuls (N above)."""
    lookup = model.vocab_size * model.hidden_size + model.type_vocab_size * model.hidden_size
    if model.position.value == "learned":
        lookup += model.max_position * model.hidden_size
    n = model.num_params(active_only=True) - lookup
    if model.tied_embeddings and model.arch == Arch.DECODER:
        n += model.vocab_size * model.hidden_size  # the tied head still multiplies
    n += model.mtp_num_layers * model.vocab_size * model.hidden_size  # each MTP module's head pass
    return n


def mixer_core_flops_per_token(model: ModelSpec, kind: LayerKind, seq_len: int) -> float:
    """One forward of a layer's attention core (QK^T + AV, no causal halving) or SSD scan."""
    if kind.mixer == Mixer.ATTENTION:
        keys = min(model.sliding_window, seq_len) if kind.sliding else seq_len
        return 2.0 * keys * model.num_heads * (model.qk_head_dim + model.v_dim)
    if kind.mixer == Mixer.MAMBA:
        n, P = model.mamba_num_heads, model.mamba_head_dim
        G, Ns, Q = model.mamba_groups, model.mamba_state_size, model.mamba_chunk_size
        return 2.0 * (G * Q * Ns + n * Q * P + 2 * n * Ns * P + model.mamba_conv_width * mamba_conv_channels(model))
    return 0.0


def core_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """One forward of every layer's (and MTP module's) core, summed."""
    total = sum(n * mixer_core_flops_per_token(model, kind, seq_len) for kind, n in layer_kind_counts(model))
    return total + model.mtp_num_layers * mixer_core_flops_per_token(model, mtp_kind(model), seq_len)


@lru_cache(maxsize=64)  # a pure function of frozen specs, asked for by every cost-model pass of a search
def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """6N + 12 L S q (forward + backward, no recompute), generalised per layer (module doc)."""
    return 6.0 * matmul_params(model) + 3.0 * core_flops_per_token(model, seq_len)


def reported_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, basis: str) -> float:
    """The per-token FLOPs that Megatron-LM / Megatron-DeepSpeed print as TFLOP/s.

    Narayanan et al. 2021 Sec. 5.1 (eq. 3): 96 B s l h^2 (1 + s/6h + V/16lh) per iteration with
    full recompute, i.e. per token and layer 24 h^2 + 4 s h per pass, 4 passes with full
    recompute (3 without), and 2 h V per pass for the LM head, 3 passes. Selective recompute
    adds one forward of the attention core, 4 s h (Korthikanti et al. 2022 Sec. 6). The 'model'
    basis counts no recompute. Generalised from 24 h^2 to 2x the layer's matmul parameters.
    """
    layers_matmul = 2.0 * (model.num_params(active_only=True) - model.embedding_params()
                           - model.head_params())
    attn = core_flops_per_token(model, seq_len)
    layer_pass = layers_matmul + attn
    head_pass = 2.0 * model.hidden_size * model.vocab_size * (1 + model.mtp_num_layers)
    passes = 3.0
    extra = 0.0
    if basis == "hardware":
        if recompute == "full":
            passes = 4.0
        elif recompute == "selective":
            extra = attn
    return passes * layer_pass + extra + 3.0 * head_pass
