"""Model description: the architecture numbers every other part of meshplan reads.

Symbols (the scaling book's table): L layers, D hidden, N query heads, K KV heads, H head dim,
F FFN hidden, V vocab, E experts, k experts per token (top-k).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count, check_finite


class Arch(str, enum.Enum):
    DECODER = "decoder"  # causal LM (GPT, Llama, Mistral, Qwen, Mixtral)
    ENCODER = "encoder"  # bidirectional encoder with an MLM head (BERT)


class Norm(str, enum.Enum):
    LAYERNORM = "layernorm"  # weight + bias
    RMSNORM = "rmsnorm"  # weight only


class Position(str, enum.Enum):
    ROPE = "rope"  # rotary, no parameters
    LEARNED = "learned"  # learned absolute table of max_position x D


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A Transformer, dense or MoE. Frozen; validated on construction."""

    name: str
    num_layers: int
    """L: transformer blocks."""
    hidden_size: int
    """D: model width."""
    num_heads: int
    """N: query heads."""
    num_kv_heads: int = 0
    """K: key/value heads (GQA/MQA); 0 means = num_heads (MHA)."""
    head_dim: int = 0
    """H: per-head width; 0 means hidden_size // num_heads."""
    ffn_hidden_size: int = 0
    """F: MLP inner width of a dense layer; 0 means 4 * hidden_size."""
    gated_mlp: bool = False
    """SwiGLU (three matrices: gate, up, down) instead of a plain two-matrix GELU MLP."""
    vocab_size: int
    """V."""
    tied_embeddings: bool = False
    """LM head shares the input embedding matrix."""
    arch: Arch = Arch.DECODER
    norm: Norm = Norm.LAYERNORM
    position: Position = Position.LEARNED
    max_position: int = 2048
    """Rows of the learned position table (ignored for RoPE)."""
    attn_bias: bool = False
    """Bias on the q/k/v projections (GPT-2, BERT, Qwen2)."""
    mlp_bias: bool = False
    """Bias on the MLP and attention output projections (GPT-2, BERT)."""
    moe_num_experts: int = 0
    """E: routed experts per MoE layer; 0 means a dense model."""
    moe_top_k: int = 0
    """k: routed experts per token."""
    moe_ffn_hidden_size: int = 0
    """Inner width of one routed expert; 0 means ffn_hidden_size."""
    moe_shared_experts: int = 0
    """Always-on shared experts per MoE layer (DeepSeek/Qwen-MoE style), each of moe_ffn width."""
    moe_dense_layers: int = 0
    """Leading layers that keep a dense MLP (DeepSeek's first_k_dense_replace)."""
    type_vocab_size: int = 0
    """BERT token-type embeddings (2 for BERT)."""
    moe_shared_ffn_hidden_size: int = 0
    """Inner width of one shared expert; 0 means moe_ffn_hidden_size (Nemotron 3: 2x routed)."""
    moe_latent_size: int = 0
    """LatentMoE (Nemotron 3 Super/Ultra): routed experts read and write this width instead of D,
    behind a D -> latent and a latent -> D projection per layer; 0 means none."""
    q_lora_rank: int = 0
    """MLA (DeepSeek-V2 Sec. 2.1): query down-projection rank d_c'; 0 means a full-rank W^Q."""
    kv_lora_rank: int = 0
    """MLA compressed KV width d_c; 0 means standard (GQA/MHA) attention."""
    qk_rope_head_dim: int = 0
    """MLA decoupled RoPE query/key width per head (d_h^R)."""
    qk_nope_head_dim: int = 0
    """MLA per-head query/key width without RoPE (d_h)."""
    v_head_dim: int = 0
    """MLA per-head value width."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key (Qwen3)."""
    sliding_window: int = 0
    """Tokens a sliding-window attention layer attends to; 0 means full attention everywhere."""
    full_attention_period: int = 0
    """With sliding_window: every n-th layer keeps full attention (GPT-OSS 2); 0: all slide."""
    attention_sinks: bool = False
    """A learned per-head sink logit in the softmax (GPT-OSS)."""
    glu_clamp_limit: float = 0.0
    """Gated MLP whose gate is clamped to at most this value and whose linear half to +-it before
    the activation (GPT-OSS: HF config ``swiglu_limit`` 7.0; Megatron-Core
    ``activation_func_clamp_value``); 0 means no clamp."""
    mtp_num_layers: int = 0
    """Multi-token-prediction modules after the stack (DeepSeek-V3 Sec. 2.2: D = 1)."""
    hybrid_pattern: str = ""
    """Per-layer kinds, one letter each (M Mamba-2, * attention, - MLP, E MoE), as Nemotron-H's
    hybrid_override_pattern; empty means every layer is attention + MLP/MoE."""
    mamba_state_size: int = 0
    """Mamba-2 SSM state size N (ssm_state_size)."""
    mamba_conv_width: int = 4
    """Mamba-2 causal conv kernel width (conv_kernel; 4 in Dao & Gu 2024 and Nemotron-H)."""
    mamba_num_heads: int = 0
    """Mamba-2 heads."""
    mamba_head_dim: int = 0
    """Mamba-2 head dim P (d_inner = heads * P)."""
    mamba_groups: int = 1
    """Mamba-2 B/C groups (n_groups)."""
    mamba_chunk_size: int = 128
    """SSD chunk length Q (Dao & Gu 2024 Sec. 6; Nemotron-H chunk_size 128)."""

    def __post_init__(self) -> None:
        for f, enum_cls in (("arch", Arch), ("norm", Norm), ("position", Position)):
            try:
                object.__setattr__(self, f, enum_cls(getattr(self, f)))
            except ValueError:
                raise MeshplanError(f"model {self.name!r}: {f}={getattr(self, f)!r} is not one of "
                                    f"{', '.join(e.value for e in enum_cls)}") from None
        for f in fields(self):  # a file's {} or [] here would reach the cost model's caches unhashable
            kind = {"bool": bool, "str": str}.get(f.type)
            if kind is not None and not isinstance(getattr(self, f.name), kind):
                raise MeshplanError(f"model {self.name!r}: {f.name} must be {'true or false' if kind is bool else 'text'}, "
                                    f"got {getattr(self, f.name)!r}")
        for f in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
            check_count(f"model {self.name!r}: {f}", getattr(self, f))
        for f in ("num_kv_heads", "head_dim", "ffn_hidden_size", "moe_num_experts", "moe_top_k",
                  "moe_ffn_hidden_size", "moe_shared_experts", "moe_dense_layers", "type_vocab_size",
                  "max_position", "moe_shared_ffn_hidden_size", "moe_latent_size", "q_lora_rank", "kv_lora_rank",
                  "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window",
                  "full_attention_period", "mtp_num_layers", "mamba_state_size", "mamba_conv_width",
                  "mamba_num_heads", "mamba_head_dim", "mamba_groups", "mamba_chunk_size"):
            check_count(f"model {self.name!r}: {f}", getattr(self, f), minimum=0)
        object.__setattr__(self, "glu_clamp_limit",
                           check_finite(f"model {self.name!r}: glu_clamp_limit", self.glu_clamp_limit))
        # Fill derived defaults (frozen: go through object.__setattr__ once, here only).
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise MeshplanError(
                    f"model {self.name!r}: hidden_size={self.hidden_size} is not divisible by "
                    f"num_heads={self.num_heads} (give head_dim explicitly)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.num_heads % self.num_kv_heads:
            raise MeshplanError(
                f"model {self.name!r}: num_heads={self.num_heads} is not divisible by "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.moe_num_experts:
            if not 1 <= self.moe_top_k <= self.moe_num_experts:
                raise MeshplanError(
                    f"model {self.name!r}: moe_top_k={self.moe_top_k} must be in 1..{self.moe_num_experts}"
                )
            if self.moe_ffn_hidden_size == 0:
                object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
            if self.moe_dense_layers >= self.num_layers:
                raise MeshplanError(f"model {self.name!r}: moe_dense_layers must be below num_layers")
            if self.moe_shared_ffn_hidden_size == 0:
                object.__setattr__(self, "moe_shared_ffn_hidden_size", self.moe_ffn_hidden_size)
        elif self.moe_top_k or self.moe_shared_experts or self.moe_dense_layers or self.moe_latent_size:
            raise MeshplanError(f"model {self.name!r}: MoE fields set but moe_num_experts is 0")
        from meshplan.spec.layers import check_layout

        check_layout(self)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe_num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        return bool(self.hybrid_pattern)

    @property
    def num_moe_layers(self) -> int:
        from meshplan.spec.layers import Ffn, layer_kind_counts

        return sum(n for kind, n in layer_kind_counts(self) if kind.ffn == Ffn.MOE)

    @property
    def q_size(self) -> int:
        """N * H: width of the query projection output (MLA: N * (d_nope + d_rope))."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of the QK^T product."""
        return self.q_size // self.num_heads

    @property
    def v_dim(self) -> int:
        """Per-head width of the values (the AV product)."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_size(self) -> int:
        """K * H: width of each of the key and value projection outputs."""
        return self.num_kv_heads * self.head_dim

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == Norm.LAYERNORM else 1)

    def attention_params(self) -> int:
        from meshplan.spec.layers import attention_params

        return attention_params(self)

    def mlp_params(self, ffn: int, width: int = 0) -> int:
        """One MLP (dense layer or one expert) of inner width ``ffn`` on ``width``-wide tokens
        (0: hidden_size; a LatentMoE expert: moe_latent_size)."""
        width = width or self.hidden_size
        p = self._mlp_matrices * width * ffn
        if self.mlp_bias:
            p += (self._mlp_matrices - 1) * ffn + width
        return p

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params(self.ffn_hidden_size) + 2 * self.norm_params()

    def moe_layer_params(self, active_only: bool = False) -> int:
        """Attention + router + routed experts (all, or top-k when active_only) + shared experts."""
        from meshplan.spec.layers import Ffn, LayerKind, Mixer, kind_params

        return kind_params(self, LayerKind(Mixer.ATTENTION, Ffn.MOE), active_only)

    def layer_params(self, layer: int, active_only: bool = False) -> int:
        from meshplan.spec.layers import kind_params, layer_kind

        return kind_params(self, layer_kind(self, layer), active_only)

    def mtp_params(self, active_only: bool = False) -> int:
        """All multi-token-prediction modules (their embedding and head are the main model's)."""
        from meshplan.spec.layers import mtp_module_params

        return self.mtp_num_layers * mtp_module_params(self, active_only) if self.mtp_num_layers else 0

    def embedding_params(self) -> int:
        """Token (+ learned position, + token type) embeddings."""
        p = self.vocab_size * self.hidden_size
        if self.position == Position.LEARNED:
            p += self.max_position * self.hidden_size
        p += self.type_vocab_size * self.hidden_size
        if self.arch == Arch.ENCODER:
            p += self.norm_params()  # BERT's embedding LayerNorm
        return p

    def head_params(self) -> int:
        """Final norm and output head (LM head unless tied; BERT: pooler + MLM transform)."""
        p = self.norm_params() if self.arch == Arch.DECODER else 0
        if self.arch == Arch.ENCODER:
            D = self.hidden_size
            p += D * D + D  # pooler
            p += D * D + D + self.norm_params() + self.vocab_size  # MLM transform + decoder bias
        if not self.tied_embeddings:
            p += self.vocab_size * self.hidden_size
        return p

    def num_params(self, active_only: bool = False, *, include_mtp: bool = True) -> int:
        """Total parameters (or those one token touches, for MoE), MTP modules included unless
        ``include_mtp`` is False (DeepSeek-V3's published 671B excludes its MTP module)."""
        from meshplan.spec.layers import kind_params, layer_kind_counts

        layers = sum(n * kind_params(self, kind, active_only) for kind, n in layer_kind_counts(self))
        mtp = self.mtp_params(active_only) if include_mtp else 0
        return self.embedding_params() + layers + mtp + self.head_params()

    # ---- overrides and JSON --------------------------------------------------------------
    def with_overrides(self, overrides: dict[str, Any]) -> "ModelSpec":
        """A copy with some fields changed (``--override num_layers=2,hidden_size=64``).

        Derived fields (head_dim, ffn sizes) are recomputed unless given, so shrinking
        hidden_size gives a consistent tiny model.
        """
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key not in known:
                raise MeshplanError(f"unknown model field in override: {key!r}")
            changes[key] = _coerce(key, raw, getattr(self, key))
        base = asdict(self)
        if "hidden_size" in changes or "num_heads" in changes:
            base["head_dim"] = 0
            if "ffn_hidden_size" not in changes and self.hidden_size:
                ratio = self.ffn_hidden_size / self.hidden_size
                hid = changes.get("hidden_size", self.hidden_size)
                changes.setdefault("ffn_hidden_size", max(1, int(round(ratio * hid))))
            if self.is_moe and "moe_ffn_hidden_size" not in changes:
                ratio = self.moe_ffn_hidden_size / self.hidden_size
                hid = changes.get("hidden_size", self.hidden_size)
                changes.setdefault("moe_ffn_hidden_size", max(1, int(round(ratio * hid))))
                if "moe_shared_ffn_hidden_size" not in changes:
                    ratio = self.moe_shared_ffn_hidden_size / self.hidden_size
                    changes["moe_shared_ffn_hidden_size"] = max(1, int(round(ratio * hid)))
        if ("moe_ffn_hidden_size" in changes and "moe_shared_ffn_hidden_size" not in changes
                and self.moe_shared_ffn_hidden_size == self.moe_ffn_hidden_size):
            changes["moe_shared_ffn_hidden_size"] = 0  # shared experts keep following the routed width
        if ("num_layers" in changes and self.hybrid_pattern and "hybrid_pattern" not in changes
                and int(changes["num_layers"]) < len(self.hybrid_pattern)):
            # a shallower copy keeps the first layers of the pattern (like num_layers=2 on a stack)
            changes["hybrid_pattern"] = self.hybrid_pattern[: int(changes["num_layers"])]
        if "num_heads" in changes and "num_kv_heads" not in changes:
            # keep the GQA group size if it still divides, else fall back to MHA
            group = self.num_heads // self.num_kv_heads
            nh = changes["num_heads"]
            changes["num_kv_heads"] = nh // group if nh % group == 0 and nh >= group else nh
        base.update(changes)
        return ModelSpec.from_dict(base)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("arch", "norm", "position"):
            out[k] = out[k].value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        known = {f.name for f in fields(cls)}
        extra = set(data) - known
        if extra:
            raise MeshplanError(f"unknown model field(s): {', '.join(sorted(extra))}")
        try:
            data = dict(data)
            for k, enum_cls in (("arch", Arch), ("norm", Norm), ("position", Position)):
                if k in data:
                    data[k] = enum_cls(data[k])
            return cls(**data)
        except MeshplanError:
            raise
        except (TypeError, ValueError) as exc:
            raise MeshplanError(f"invalid model description: {exc}") from None


def _coerce(key: str, raw: Any, current: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        if isinstance(current, bool):
            if raw.lower() in ("1", "true", "yes"):
                return True
            if raw.lower() in ("0", "false", "no"):
                return False
            raise ValueError(raw)
        if isinstance(current, enum.Enum):
            return type(current)(raw).value
        if isinstance(current, int):
            return int(raw)
        return raw
    except ValueError:
        raise MeshplanError(f"override {key}={raw!r}: not a valid value") from None


def parse_overrides(text: str | None) -> dict[str, str]:
    """Parse ``num_layers=2,hidden_size=64`` into a dict of strings."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise MeshplanError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def scaled(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """Programmatic twin of with_overrides for tests: ``scaled(spec, num_layers=2)``."""
    return spec.with_overrides(changes) if changes else replace(spec)
