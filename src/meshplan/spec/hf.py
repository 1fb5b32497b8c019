"""Import a Hugging Face ``config.json`` from disk (no network) into a ModelSpec.

Layouts read: llama, mistral, qwen2 (decoder, RoPE, RMSNorm, SwiGLU), qwen3 (+ QK-norm), mixtral,
qwen2_moe and qwen3_moe (MoE), deepseek_v3 / kimi_k2 (multi-head latent attention, shared experts,
leading dense layers, MTP), gpt_oss (sliding windows, attention sinks, biased experts), gemma,
gemma2 and gemma3_text (GeGLU, tied head, local/global sliding-window layers; Gemma 3 + QK-norm),
nemotron_h (hybrid Mamba-2 / attention / MLP / MoE pattern), gpt2 (learned positions, LayerNorm,
GELU MLP, tied head) and bert (encoder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.jsonfile import load_json_file
from meshplan.spec.model import Arch, ModelSpec, Norm, Position

_GEMMA = {"gemma", "gemma2", "gemma3_text"}
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe", "gpt_oss", *_GEMMA}
_DEEPSEEK = {"deepseek_v3", "kimi_k2"}


def _req(cfg: dict[str, Any], path: Path, *keys: str) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise MeshplanError(f"{path}: config.json has no {' / '.join(keys)} field")


def _rope_decoder(cfg: dict[str, Any], path: Path, *, attn_bias_default: bool) -> dict[str, Any]:
    """The fields every Llama-style decoder config gives alike: SwiGLU, RMSNorm, RoPE."""
    return dict(
        ffn_hidden_size=int(_req(cfg, path, "intermediate_size")),
        vocab_size=int(_req(cfg, path, "vocab_size")),
        gated_mlp=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm=Norm.RMSNORM,
        position=Position.ROPE,
        max_position=int(cfg.get("max_position_embeddings") or 0),
        attn_bias=bool(cfg.get("attention_bias", attn_bias_default)),
    )


def spec_from_hf_dict(cfg: dict[str, Any], *, name: str, path: Path = Path("config.json")) -> ModelSpec:
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type in _LLAMA_LIKE:
        hidden = int(_req(cfg, path, "hidden_size"))
        heads = int(_req(cfg, path, "num_attention_heads"))
        kw: dict[str, Any] = dict(
            name=name,
            num_layers=int(_req(cfg, path, "num_hidden_layers")),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or 0),
            **_rope_decoder(cfg, path, attn_bias_default=model_type in ("qwen2", "qwen2_moe")),
        )
        if model_type in ("qwen3", "qwen3_moe"):
            kw["qk_norm"] = True  # Qwen3Attention: q_norm / k_norm over head_dim
        if model_type == "gpt_oss":
            kw.update(_gpt_oss(cfg, path))
        if model_type in _GEMMA:
            kw.update(_gemma(cfg, path, model_type))
        if model_type == "mixtral":
            kw.update(moe_num_experts=int(_req(cfg, path, "num_local_experts")),
                      moe_top_k=int(_req(cfg, path, "num_experts_per_tok")))
        elif model_type in ("qwen2_moe", "qwen3_moe"):
            kw.update(
                moe_num_experts=int(_req(cfg, path, "num_experts")),
                moe_top_k=int(_req(cfg, path, "num_experts_per_tok")),
                moe_ffn_hidden_size=int(_req(cfg, path, "moe_intermediate_size")),
            )
            shared = int(cfg.get("shared_expert_intermediate_size") or 0)
            if shared:
                kw.update(moe_shared_experts=1, moe_shared_ffn_hidden_size=shared)
            if int(cfg.get("decoder_sparse_step") or 1) != 1 or cfg.get("mlp_only_layers"):
                raise MeshplanError(f"{path}: decoder_sparse_step / mlp_only_layers (interleaved dense "
                                    "layers) are not supported")
        return ModelSpec(**kw)
    if model_type in _DEEPSEEK:
        return _deepseek(cfg, name, path)
    if model_type == "nemotron_h":
        return _nemotron_h(cfg, name, path)
    if model_type == "gpt2":
        hidden = int(_req(cfg, path, "n_embd", "hidden_size"))
        return ModelSpec(
            name=name,
            num_layers=int(_req(cfg, path, "n_layer", "num_hidden_layers")),
            hidden_size=hidden,
            num_heads=int(_req(cfg, path, "n_head", "num_attention_heads")),
            ffn_hidden_size=int(cfg.get("n_inner") or 4 * hidden),
            vocab_size=int(_req(cfg, path, "vocab_size")),
            max_position=int(cfg.get("n_positions") or 1024),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            norm=Norm.LAYERNORM,
            position=Position.LEARNED,
            attn_bias=True,
            mlp_bias=True,
        )
    if model_type == "bert":
        return ModelSpec(
            name=name,
            arch=Arch.ENCODER,
            num_layers=int(_req(cfg, path, "num_hidden_layers")),
            hidden_size=int(_req(cfg, path, "hidden_size")),
            num_heads=int(_req(cfg, path, "num_attention_heads")),
            ffn_hidden_size=int(_req(cfg, path, "intermediate_size")),
            vocab_size=int(_req(cfg, path, "vocab_size")),
            max_position=int(cfg.get("max_position_embeddings") or 512),
            type_vocab_size=int(cfg.get("type_vocab_size") or 0),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            norm=Norm.LAYERNORM,
            position=Position.LEARNED,
            attn_bias=True,
            mlp_bias=True,
        )
    raise MeshplanError(
        f"{path}: model_type {cfg.get('model_type')!r} is not supported "
        f"(known: {', '.join(sorted(_LLAMA_LIKE | _DEEPSEEK | {'nemotron_h', 'gpt2', 'bert'}))})"
    )


def _gpt_oss(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """GPT-OSS: biased q/k/v/o and experts (and router), sinks, alternating sliding windows."""
    kw: dict[str, Any] = dict(
        attn_bias=True, mlp_bias=True, attention_sinks=True,
        moe_num_experts=int(_req(cfg, path, "num_local_experts")),
        moe_top_k=int(_req(cfg, path, "num_experts_per_tok", "experts_per_token")),
        moe_ffn_hidden_size=int(_req(cfg, path, "intermediate_size")),
        glu_clamp_limit=float(cfg.get("swiglu_limit", 0.0) or 0.0),
    )
    # modeling_gpt_oss default without layer_types: sliding on even layers, full on odd
    kw.update(_sliding_windows(cfg, path, default_period=2))
    return kw


def _sliding_windows(cfg: dict[str, Any], path: Path, *, default_period: int) -> dict[str, Any]:
    """``sliding_window`` and the period of the full-attention layers among them: from
    ``layer_types`` where given (full on layers period-1, 2*period-1, ...), else ``default_period``."""
    window = int(cfg.get("sliding_window") or 0)
    types = cfg.get("layer_types") or []
    if not window:
        return {}
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not types:
        period = default_period
    elif full and all((i + 1) % (full[0] + 1) == 0 for i in full) \
            and len(full) == len(types) // (full[0] + 1):
        period = full[0] + 1
    elif not full:
        period = 0
    else:
        raise MeshplanError(f"{path}: layer_types is not a periodic sliding/full pattern")
    return dict(sliding_window=window, full_attention_period=period)


def _gemma(cfg: dict[str, Any], path: Path, model_type: str) -> dict[str, Any]:
    """Gemma 1/2/3 text models: a GeGLU MLP (gelu_pytorch_tanh gate: the FLOPs and weights of
    SwiGLU), the head tied to the embedding (GemmaConfig's tie_word_embeddings defaults to True),
    and from Gemma 2 on local sliding-window layers between global ones: every other layer in
    Gemma 2 (Gemma2DecoderLayer: sliding on even layers), one global in ``sliding_window_pattern``
    (6) in Gemma 3, which also norms q and k (Gemma3Attention q_norm / k_norm). Not priced: the
    extra pre/post-feedforward norms, the embedding scale and the logit soft-caps (elementwise)."""
    kw: dict[str, Any] = dict(tied_embeddings=bool(cfg.get("tie_word_embeddings", True)))
    if model_type == "gemma3_text":
        kw["qk_norm"] = True
    if model_type != "gemma":  # Gemma 1 attends globally on every layer
        period = int(cfg.get("sliding_window_pattern") or 6) if model_type == "gemma3_text" else 2
        kw.update(_sliding_windows(cfg, path, default_period=period))
    return kw


def _deepseek(cfg: dict[str, Any], name: str, path: Path) -> ModelSpec:
    """DeepSeek-V3 / Kimi-K2 (modeling_deepseek.py): MLA, routed + shared experts, first_k_dense_replace
    dense layers, num_nextn_predict_layers MTP modules."""
    hidden = int(_req(cfg, path, "hidden_size"))
    return ModelSpec(
        name=name,
        num_layers=int(_req(cfg, path, "num_hidden_layers")),
        hidden_size=hidden,
        num_heads=int(_req(cfg, path, "num_attention_heads")),
        **_rope_decoder(cfg, path, attn_bias_default=False),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(_req(cfg, path, "kv_lora_rank")),
        qk_rope_head_dim=int(_req(cfg, path, "qk_rope_head_dim")),
        qk_nope_head_dim=int(_req(cfg, path, "qk_nope_head_dim")),
        v_head_dim=int(_req(cfg, path, "v_head_dim")),
        moe_num_experts=int(_req(cfg, path, "n_routed_experts")),
        moe_top_k=int(_req(cfg, path, "num_experts_per_tok")),
        moe_ffn_hidden_size=int(_req(cfg, path, "moe_intermediate_size")),
        moe_shared_experts=int(cfg.get("n_shared_experts") or 0),
        moe_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
        mtp_num_layers=int(cfg.get("num_nextn_predict_layers") or 0),
    )


def _nemotron_h(cfg: dict[str, Any], name: str, path: Path) -> ModelSpec:
    """Nemotron-H / Nemotron 3 (configuration_nemotron_h.py): one part per layer from
    hybrid_override_pattern (or layers_block_type), relu2 (two-matrix) MLPs, no position encoding."""
    pattern = cfg.get("hybrid_override_pattern")
    if not pattern and cfg.get("layers_block_type"):
        letters = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        try:
            pattern = "".join(letters[b] for b in cfg["layers_block_type"])
        except KeyError as exc:
            raise MeshplanError(f"{path}: layers_block_type entry {exc.args[0]!r} is not one of "
                                f"{', '.join(letters)}") from None
    if not pattern:
        raise MeshplanError(f"{path}: config.json has no hybrid_override_pattern / layers_block_type field")
    mtp_pattern = cfg.get("mtp_hybrid_override_pattern")
    if cfg.get("num_nextn_predict_layers") and mtp_pattern not in (None, "*E", "*-"):
        raise MeshplanError(f"{path}: mtp_hybrid_override_pattern {mtp_pattern!r} is not supported "
                            "(an MTP module is one attention + MLP/MoE block)")
    kw: dict[str, Any] = {}
    if "E" in pattern:
        shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        kw = dict(moe_num_experts=int(_req(cfg, path, "n_routed_experts")),
                  moe_top_k=int(_req(cfg, path, "num_experts_per_tok")),
                  moe_ffn_hidden_size=int(_req(cfg, path, "moe_intermediate_size")),
                  moe_shared_experts=int(cfg.get("n_shared_experts") or (1 if shared else 0)),
                  moe_shared_ffn_hidden_size=shared,
                  moe_latent_size=int(cfg.get("moe_latent_size") or 0))
    return ModelSpec(
        name=name,
        num_layers=len(pattern),
        hidden_size=int(_req(cfg, path, "hidden_size")),
        num_heads=int(_req(cfg, path, "num_attention_heads")),
        num_kv_heads=int(cfg.get("num_key_value_heads") or 0),
        head_dim=int(cfg.get("head_dim") or cfg.get("attention_head_dim") or 0),
        ffn_hidden_size=int(_req(cfg, path, "intermediate_size")),
        vocab_size=int(_req(cfg, path, "vocab_size")),
        gated_mlp=False,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm=Norm.RMSNORM,
        position=Position.ROPE,  # NoPE: no position parameters either way
        attn_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        hybrid_pattern=pattern,
        mamba_state_size=int(_req(cfg, path, "ssm_state_size")),
        mamba_conv_width=int(cfg.get("conv_kernel") or 4),
        mamba_num_heads=int(_req(cfg, path, "mamba_num_heads")),
        mamba_head_dim=int(_req(cfg, path, "mamba_head_dim")),
        mamba_groups=int(cfg.get("n_groups") or 1),
        mamba_chunk_size=int(cfg.get("chunk_size") or 128),
        mtp_num_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        **kw,
    )


def load_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = load_json_file(p, lambda d: d, missing="no such config.json", what="Hugging Face config.json")
    if not isinstance(cfg, dict):
        raise MeshplanError(f"{p}: config.json must hold a JSON object")
    name = str(cfg.get("_name_or_path") or p.parent.name or "hf-model")
    try:
        return spec_from_hf_dict(cfg, name=name, path=p)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, MeshplanError):  # most already name the file (``_req``): name it once
            said = str(exc)
            raise MeshplanError(said if said.startswith(f"{p}:") else f"{p}: {said}") from None
        raise MeshplanError(f"{p}: malformed config.json ({exc})") from None
