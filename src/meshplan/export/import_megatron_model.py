"""The model shape a Megatron-LM command line gives (``--num-layers``, ``--hidden-size``, MoE,
MLA, windows, hybrid Mamba...) as a ModelSpec, and the check that it agrees with a ``--model``
preset named beside it (used by ``import_megatron``)."""

from __future__ import annotations

import argparse

from meshplan.errors import MeshplanError
from meshplan.spec.model import ModelSpec, Norm, Position


def _model_from_args(a: argparse.Namespace, vocab_default: int | None, name: str) -> ModelSpec | None:
    shape = (a.num_layers, a.hidden_size, a.num_attention_heads)
    if all(v is None for v in shape):
        return None
    if any(v is None for v in shape):
        raise MeshplanError("Megatron arguments give part of the model shape: need --num-layers, "
                            "--hidden-size and --num-attention-heads together")
    vocab = a.vocab_size or vocab_default
    if vocab is None:
        raise MeshplanError("the Megatron arguments do not give --vocab-size (it comes from the "
                            "tokenizer): add --vocab-size N to them or give --model")
    moe: dict[str, int] = {}
    if a.num_experts:
        moe = dict(moe_num_experts=a.num_experts, moe_top_k=a.moe_router_topk or 2,
                   moe_ffn_hidden_size=a.moe_ffn_hidden_size or 0)
        if a.moe_shared_expert_intermediate_size:
            # n shared experts of the routed width when it divides, else one of the given width
            width = a.moe_ffn_hidden_size or a.ffn_hidden_size or 4 * a.hidden_size
            n, rest = divmod(a.moe_shared_expert_intermediate_size, width)
            if n and not rest:
                moe["moe_shared_experts"] = n
            else:
                moe.update(moe_shared_experts=1, moe_shared_ffn_hidden_size=a.moe_shared_expert_intermediate_size)
        if a.moe_layer_freq and a.moe_layer_freq.startswith("[0]*"):
            moe["moe_dense_layers"] = int(a.moe_layer_freq[4:].split("+", 1)[0])
        if a.moe_latent_size:
            moe["moe_latent_size"] = a.moe_latent_size
    pos = a.position_embedding_type or "learned_absolute"
    if pos not in ("rope", "learned_absolute"):
        raise MeshplanError(f"--position-embedding-type {pos!r} is not supported (rope, learned_absolute)")
    gqa = a.group_query_attention and a.num_query_groups
    return ModelSpec(
        name=name,
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        num_heads=a.num_attention_heads,
        num_kv_heads=a.num_query_groups if gqa else 0,
        head_dim=a.kv_channels or 0,
        ffn_hidden_size=a.ffn_hidden_size or 0,
        gated_mlp=a.swiglu,
        vocab_size=vocab,
        tied_embeddings=not a.untie_embeddings_and_output_weights,
        norm=Norm.RMSNORM if (a.normalization or "LayerNorm") == "RMSNorm" else Norm.LAYERNORM,
        position=Position.ROPE if pos == "rope" else Position.LEARNED,
        max_position=a.max_position_embeddings or (0 if pos == "rope" else 2048),
        attn_bias=(not a.disable_bias_linear) or a.add_qkv_bias,
        mlp_bias=not a.disable_bias_linear,
        **moe,
        **_layout_fields(a),
    )


def _layout_fields(a: argparse.Namespace) -> dict[str, object]:
    """MLA, QK-norm, sliding windows and sinks, MTP and hybrid Mamba fields (export/megatron.py)."""
    out: dict[str, object] = {}
    if a.multi_latent_attention:
        out.update(q_lora_rank=a.q_lora_rank or 0, kv_lora_rank=a.kv_lora_rank or 0,
                   qk_nope_head_dim=a.qk_head_dim or 0, qk_rope_head_dim=a.qk_pos_emb_head_dim or 0,
                   v_head_dim=a.v_head_dim or 0)
    elif a.qk_layernorm:
        out["qk_norm"] = True
    if a.window_size:
        try:
            out["sliding_window"] = int(str(a.window_size).split(",")[0])
            out["full_attention_period"] = int(a.window_attn_skip_freq or 0)
        except ValueError:
            raise MeshplanError(f"--window-size {a.window_size} / --window-attn-skip-freq "
                                f"{a.window_attn_skip_freq}: only 'W,0' and an integer period are read") from None
    if a.softmax_type not in (None, "vanilla"):
        if a.softmax_type != "learnable":
            raise MeshplanError(f"--softmax-type {a.softmax_type!r} is not supported (vanilla, learnable)")
        out["attention_sinks"] = True
    if a.activation_func_clamp_value:
        out["glu_clamp_limit"] = float(a.activation_func_clamp_value)
    if a.mtp_num_layers:
        out["mtp_num_layers"] = a.mtp_num_layers
    if a.hybrid_override_pattern:
        out.update(hybrid_pattern=a.hybrid_override_pattern, mamba_num_heads=a.mamba_num_heads or 0,
                   mamba_head_dim=a.mamba_head_dim or 0, mamba_state_size=a.mamba_state_dim or 0,
                   mamba_groups=a.mamba_num_groups or 1)
    return out


def _check_same_shape(a: argparse.Namespace, model: ModelSpec) -> None:
    """The shape the arguments give explicitly must be the shape of the ``--model`` named beside
    them: a contradiction is refused, not settled silently for one side."""
    gqa = a.group_query_attention and a.num_query_groups
    given = (("--num-layers", a.num_layers, model.num_layers),
             ("--hidden-size", a.hidden_size, model.hidden_size),
             ("--num-attention-heads", a.num_attention_heads, model.num_heads),
             ("--num-query-groups", a.num_query_groups if gqa else None, model.num_kv_heads),
             ("--ffn-hidden-size", a.ffn_hidden_size, model.ffn_hidden_size),
             ("--vocab-size", a.vocab_size, model.vocab_size),
             ("--num-experts", a.num_experts, model.moe_num_experts))
    differ = [f"{flag} {mine} (the preset has {theirs})" for flag, mine, theirs in given
              if mine is not None and mine != theirs]
    if differ:
        raise MeshplanError(f"the Megatron arguments contradict --model {model.name}: {', '.join(differ)}; "
                            "drop --model or fix the arguments")
