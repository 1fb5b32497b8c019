"""Import a Hugging Face ``config.json`` from disk (no network) into a ModelSpec.

Layouts read: llama, mistral, qwen2 (decoder, RoPE, RMSNorm, SwiGLU), mixtral and qwen2_moe (MoE),
gpt2 (learned positions, LayerNorm, GELU MLP, tied head) and bert (encoder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.jsonfile import load_json_file
from meshplan.spec.model import Arch, ModelSpec, Norm, Position

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe"}


def _req(cfg: dict[str, Any], path: Path, *keys: str) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise MeshplanError(f"{path}: config.json has no {' / '.join(keys)} field")


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
            ffn_hidden_size=int(_req(cfg, path, "intermediate_size")),
            vocab_size=int(_req(cfg, path, "vocab_size")),
            gated_mlp=True,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            norm=Norm.RMSNORM,
            position=Position.ROPE,
            max_position=int(cfg.get("max_position_embeddings") or 0),
            attn_bias=bool(cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        )
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
                # one shared expert of this width = k shared experts of the routed width
                kw["moe_shared_experts"] = max(1, round(shared / kw["moe_ffn_hidden_size"]))
        return ModelSpec(**kw)
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
        f"(known: {', '.join(sorted(_LLAMA_LIKE | {'gpt2', 'bert'}))})"
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
        if isinstance(exc, MeshplanError):
            raise MeshplanError(f"{p}: {exc}") from None
        raise MeshplanError(f"{p}: malformed config.json ({exc})") from None
