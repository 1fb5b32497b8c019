"""FLOP counts: model FLOPs for MFU, and the formulas published runs used for their TFLOP/s.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, Appendix B; torchtitan's convention):
    6 * N + 12 * L * S * q
N = parameters that do matmuls for one token (all active parameters except the input embedding
and learned position tables, which are lookups; an untied or tied LM head counts once), the
12*L*S*q term is attention's QK^T and AV (2 matmuls x 2 FLOPs x 3 for fwd+bwd x S x q per layer),
counted without the causal halving, as published MFU figures do. For GPT-3 175B at S=2048 it is
6 * 174.6e9 + 12 * 96 * 2048 * 12288 = 1.076e12 FLOPs per token.
"""

from __future__ import annotations

from meshplan.spec.model import Arch, ModelSpec


def matmul_params(model: ModelSpec) -> int:
    """Active parameters that take part in matmuls (N above)."""
    lookup = model.vocab_size * model.hidden_size + model.type_vocab_size * model.hidden_size
    if model.position.value == "learned":
        lookup += model.max_position * model.hidden_size
    n = model.num_params(active_only=True) - lookup
    if model.tied_embeddings and model.arch == Arch.DECODER:
        n += model.vocab_size * model.hidden_size  # the tied head still multiplies
    return n


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """6N + 12 L S q (forward + backward, no recompute)."""
    return 6.0 * matmul_params(model) + 12.0 * model.num_layers * seq_len * model.q_size


def reported_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, basis: str) -> float:
    """The per-token FLOPs that Megatron-LM / Megatron-DeepSpeed print as TFLOP/s.

    Narayanan et al. 2021 Sec. 5.1 (eq. 3): 96 B s l h^2 (1 + s/6h + V/16lh) per iteration with
    full recompute, i.e. per token and layer 24 h^2 + 4 s h per pass, 4 passes with full
    recompute (3 without), and 2 h V per pass for the LM head, 3 passes. Selective recompute
    adds one forward of the attention core, 4 s h (Korthikanti et al. 2022 Sec. 6). The 'model'
    basis counts no recompute. Generalised from 24 h^2 to 2x the layer's matmul parameters.
    """
    per_layer_matmul = 2.0 * (model.num_params(active_only=True) - model.embedding_params()
                              - model.head_params()) / model.num_layers
    attn = 4.0 * seq_len * model.q_size
    layer_pass = per_layer_matmul + attn
    head_pass = 2.0 * model.hidden_size * model.vocab_size
    passes = 3.0
    extra = 0.0
    if basis == "hardware":
        if recompute == "full":
            passes = 4.0
        elif recompute == "selective":
            extra = attn
    return model.num_layers * (passes * layer_pass + extra) + 3.0 * head_pass
