"""The model of a published run (a runs CSV row): a preset named through the alias table, its
dimensions checked against the row's; or, for stacks whose runs were GPT models, the row's own
dimensions. Every assumption is returned with the model, for the report."""

from __future__ import annotations

from typing import Mapping

from meshplan.errors import MeshplanError
from meshplan.spec.aliases import resolve_alias
from meshplan.spec.frameworks import FrameworkDefaults
from meshplan.spec.model import ModelSpec, Norm, Position
from meshplan.spec.presets import model_names, model_preset

ROW_DIMENSIONS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "moe_num_experts", "moe_top_k", "moe_ffn_hidden_size")
"""Columns of a runs CSV that describe the model's shape (blank: not given)."""


def row_model(name: str | None, dims: Mapping[str, int | None], seq_len: int,
              fw: FrameworkDefaults) -> tuple[ModelSpec, tuple[str, ...]]:
    """(model, assumptions) of a row named ``name`` with the given ``dims``; MeshplanError says
    why the row cannot be built (no preset, a dimension that disagrees, too little given)."""
    name = (name or "").strip()
    alias = resolve_alias(name) if name else None
    if alias is not None and alias.frameworks and fw.name not in alias.frameworks:
        alias = None  # the name means the preset for other frameworks' rows only
    if alias is not None:
        if alias.preset not in model_names():
            raise MeshplanError(f"no preset {alias.preset!r} (the alias of {name!r}) in this build")
        model = model_preset(alias.preset)
        for key, value in dims.items():
            if value is not None and getattr(model, key) != value:
                raise MeshplanError(f"{key}={value} in the row, but preset {alias.preset} has {getattr(model, key)}")
        note = f" ({alias.note})" if alias.note else ""
        return model, (f"model: preset {alias.preset}{note}",)
    if fw.architecture is None:
        raise MeshplanError(f"model {name!r} is not in the alias table (spec/presets/model_aliases.json) "
                            f"and {fw.name} runs have no default architecture")
    return _gpt_model(name, dims, seq_len, fw)


def _gpt_model(name: str, dims: Mapping[str, int | None], seq_len: int,
               fw: FrameworkDefaults) -> tuple[ModelSpec, tuple[str, ...]]:
    """A GPT-style model from the row's dimensions (the 2020-22 Megatron runs: LayerNorm, learned
    positions, biases, tied embeddings, FFN = 4h plain GELU when blank)."""
    for key in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
        if dims.get(key) is None:
            raise MeshplanError(f"{key} is blank")
    D, N = dims["hidden_size"], dims["num_heads"]
    assumed = [f"model: GPT-style from the row's dimensions ({fw.name} default)"]
    if dims.get("ffn_hidden_size") is None:
        assumed.append("ffn_hidden_size: 4 x hidden")
    model = ModelSpec(
        name=name or "row", num_layers=dims["num_layers"], hidden_size=D, num_heads=N,
        num_kv_heads=dims.get("num_kv_heads") or N, ffn_hidden_size=dims.get("ffn_hidden_size") or 4 * D,
        vocab_size=dims["vocab_size"], tied_embeddings=True, norm=Norm.LAYERNORM, position=Position.LEARNED,
        max_position=seq_len, attn_bias=True, mlp_bias=True,
        moe_num_experts=dims.get("moe_num_experts") or 0, moe_top_k=dims.get("moe_top_k") or 0,
        moe_ffn_hidden_size=dims.get("moe_ffn_hidden_size") or 0,
    )
    return model, tuple(assumed)
