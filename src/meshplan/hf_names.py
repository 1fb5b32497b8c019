"""Hugging Face tensor names and layouts <-> the runtime's canonical parameter names (no torch).

One table per family says, for every canonical parameter (``layers.3.attention.wq.weight``), which
Hugging Face tensor holds it and how:

- ``transpose``: GPT-2's ``Conv1D`` stores (in, out); Mixtral's experts are (F, D) linears that
  the runtime stacks as (E, D, F) / (E, F, D) batched matrices (runtime/models/moe.py);
- ``out_offset``: GPT-2 fuses q, k and v into one ``c_attn`` of width 3D; ours start at 0, D, 2D
  of its output dimension;
- ``rope_head_dim``: Hugging Face's Llama-family checkpoints rotate the channel pairs (j, j + H/2)
  of each head ("rotate_half"), the runtime rotates (2i, 2i + 1) (RoFormer, Su et al. 2021,
  Sec. 3.4.2), so query/key rows (and their biases and QK-norm weights) are permuted per head;
- ``expert_key``: one tensor per expert, ``{e}`` in the key.

Families: llama, mistral, qwen2, qwen3 (Llama layout; Qwen adds q/k/v biases, Qwen3 QK-norm),
mixtral (+ router and experts), gpt2. Both directions (loading, export) read this one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.spec.model import ModelSpec, Norm, Position

LLAMA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral")
FAMILIES = LLAMA_FAMILIES + ("gpt2",)

IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
"""Buffers some checkpoints carry (GPT-2's causal mask, old Llama's RoPE frequencies): not weights."""


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where one canonical parameter lives in a Hugging Face checkpoint."""

    key: str
    """Tensor name; with ``{e}`` for a per-expert tensor (then the canonical tensor stacks them on dim 0)."""
    transpose: bool = False
    """The HF tensor is the canonical one transposed (its last two dims swapped)."""
    out_offset: int = 0
    """Start of this parameter along the HF tensor's output dimension (fused q/k/v)."""
    rope_head_dim: int = 0
    """Head width whose rows are permuted from rotate_half to interleaved pairs (0: none)."""
    num_experts: int = 0
    """Experts stacked on dim 0 when ``key`` has ``{e}``."""


def rope_row(row: int, head_dim: int) -> int:
    """HF row holding canonical row ``row``: pair i of a head is (i, i + H/2) in HF, (2i, 2i+1) here."""
    head, j = divmod(row, head_dim)
    return head * head_dim + (j // 2 if j % 2 == 0 else j // 2 + head_dim // 2)


def family_of(spec: ModelSpec, model_type: str | None = None) -> str:
    """The HF family to read or write ``spec`` as (``model_type`` from config.json when known)."""
    if model_type is not None:
        if model_type not in FAMILIES:
            raise MeshplanError(f"Hugging Face model_type {model_type!r} has no weight mapping "
                                f"(mapped: {', '.join(FAMILIES)})")
        return model_type
    if spec.is_mla or spec.hybrid_pattern or getattr(spec, "attention_sinks", False):
        raise MeshplanError(f"{spec.name}: no Hugging Face weight mapping for this architecture "
                            f"(mapped: {', '.join(FAMILIES)})")
    if spec.position == Position.LEARNED and spec.norm == Norm.LAYERNORM:
        return "gpt2"
    if spec.is_moe:
        return "mixtral"
    if spec.qk_norm:
        return "qwen3"
    return "qwen2" if spec.attn_bias else "llama"


def name_map(spec: ModelSpec, family: str) -> dict[str, Source]:
    """Canonical parameter name -> its Source, for every parameter of the whole model."""
    if family == "gpt2":
        return _gpt2(spec)
    if family not in LLAMA_FAMILIES:
        raise MeshplanError(f"no Hugging Face weight mapping for {family!r} (mapped: {', '.join(FAMILIES)})")
    return _llama(spec, family)


def _llama(spec: ModelSpec, family: str) -> dict[str, Source]:
    H = spec.head_dim
    out: dict[str, Source] = {"tok_embeddings.weight": Source(key="model.embed_tokens.weight"),
                              "norm.weight": Source(key="model.norm.weight")}
    if not spec.tied_embeddings:
        out["output.weight"] = Source(key="lm_head.weight")
    for i in range(spec.num_layers):
        c, h = f"layers.{i}.", f"model.layers.{i}."
        out[c + "attention_norm.weight"] = Source(key=h + "input_layernorm.weight")
        out[c + "ffn_norm.weight"] = Source(key=h + "post_attention_layernorm.weight")
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            rope = H if ours in ("wq", "wk") else 0
            out[f"{c}attention.{ours}.weight"] = Source(key=f"{h}self_attn.{theirs}.weight", rope_head_dim=rope)
            bias = spec.attn_bias if ours != "wo" else spec.mlp_bias
            if bias:
                out[f"{c}attention.{ours}.bias"] = Source(key=f"{h}self_attn.{theirs}.bias", rope_head_dim=rope)
        if spec.qk_norm:
            out[c + "attention.q_norm.weight"] = Source(key=h + "self_attn.q_norm.weight", rope_head_dim=H)
            out[c + "attention.k_norm.weight"] = Source(key=h + "self_attn.k_norm.weight", rope_head_dim=H)
        if spec.is_moe and i >= spec.moe_dense_layers:
            if family != "mixtral" or spec.moe_shared_experts:
                raise MeshplanError(f"{spec.name}: MoE weights are mapped for the Mixtral layout only")
            E = spec.moe_num_experts
            out[c + "moe.router.weight"] = Source(key=h + "block_sparse_moe.gate.weight")
            for w in ("w1", "w2", "w3"):
                out[f"{c}moe.experts.{w}"] = Source(
                    key=h + "block_sparse_moe.experts.{e}." + w + ".weight", transpose=True, num_experts=E)
        else:
            for ours, theirs in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
                out[f"{c}feed_forward.{ours}.weight"] = Source(key=f"{h}mlp.{theirs}.weight")
                if spec.mlp_bias:
                    out[f"{c}feed_forward.{ours}.bias"] = Source(key=f"{h}mlp.{theirs}.bias")
    return out


def _gpt2(spec: ModelSpec) -> dict[str, Source]:
    D = spec.hidden_size
    out: dict[str, Source] = {"tok_embeddings.weight": Source(key="transformer.wte.weight"),
                              "pos_embeddings.weight": Source(key="transformer.wpe.weight")}
    for p in ("weight", "bias"):
        out[f"norm.{p}"] = Source(key=f"transformer.ln_f.{p}")
    if not spec.tied_embeddings:
        out["output.weight"] = Source(key="lm_head.weight")
    for i in range(spec.num_layers):
        c, h = f"layers.{i}.", f"transformer.h.{i}."
        for p in ("weight", "bias"):
            out[f"{c}attention_norm.{p}"] = Source(key=f"{h}ln_1.{p}")
            out[f"{c}ffn_norm.{p}"] = Source(key=f"{h}ln_2.{p}")
            for k, ours in enumerate(("wq", "wk", "wv")):  # c_attn: (D, 3D) = [q | k | v]
                out[f"{c}attention.{ours}.{p}"] = Source(key=f"{h}attn.c_attn.{p}", transpose=p == "weight",
                                                         out_offset=k * D)
            out[f"{c}attention.wo.{p}"] = Source(key=f"{h}attn.c_proj.{p}", transpose=p == "weight")
            out[f"{c}feed_forward.w1.{p}"] = Source(key=f"{h}mlp.c_fc.{p}", transpose=p == "weight")
            out[f"{c}feed_forward.w2.{p}"] = Source(key=f"{h}mlp.c_proj.{p}", transpose=p == "weight")
    return out


def hf_keys(sources: dict[str, Source]) -> set[str]:
    """Every HF tensor name the table reads."""
    keys: set[str] = set()
    for s in sources.values():
        if s.num_experts:
            keys.update(s.key.format(e=e) for e in range(s.num_experts))
        else:
            keys.add(s.key)
    return keys


def normalise_key(key: str, family: str) -> str:
    """GPT-2 checkpoints come with or without the ``transformer.`` prefix (GPT2Model vs LMHead)."""
    if family == "gpt2" and not key.startswith(("transformer.", "lm_head.")):
        return "transformer." + key
    return key


def check_all_mapped(keys: set[str], sources: dict[str, Source], family: str, where: str) -> None:
    """One-line error naming the first tensor of the checkpoint that the table does not read, or
    the first tensor the model needs that the checkpoint lacks."""
    wanted = hf_keys(sources)
    have = {normalise_key(k, family) for k in keys if not k.endswith(IGNORED_SUFFIXES)}
    if family == "gpt2" and "lm_head.weight" in have and "output.weight" not in sources:
        have.discard("lm_head.weight")  # GPT2LMHeadModel may save the tied head too
    extra = sorted(have - wanted)
    if extra:
        raise MeshplanError(f"{where}: tensor {extra[0]} has no mapping to the {family} model "
                            f"({len(extra)} unmapped)")
    missing = sorted(wanted - have)
    if missing:
        raise MeshplanError(f"{where}: the checkpoint has no tensor {missing[0]} ({len(missing)} missing)")
