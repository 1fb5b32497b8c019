"""Kinds of layers in a (possibly heterogeneous) stack and the parameter counts of their parts.

A layer is a token mixer (attention, Mamba-2, or none) followed by a channel mixer (dense MLP,
MoE, or none), each behind its own pre-norm and residual. A classic Transformer layer is
(attention, MLP or MoE); Nemotron-H / Nemotron 3 stacks give every layer ONE part, set by
the Hugging Face ``hybrid_override_pattern`` (Nemotron-H, NVIDIA 2025, Sec. 2.1):
``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE.

Symbols as in spec/model.py; Mamba-2 (Dao & Gu 2024, Sec. 7-8): P = mamba_head_dim, n = heads,
d_inner = n * P, G groups of B/C, N_s state size, W conv width.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError

if TYPE_CHECKING:  # pragma: no cover
    from meshplan.spec.model import ModelSpec


class Mixer(str, enum.Enum):
    ATTENTION = "attention"
    MAMBA = "mamba"
    NONE = "none"


class Ffn(str, enum.Enum):
    DENSE = "dense"
    MOE = "moe"
    NONE = "none"


PATTERN_CHARS: dict[str, tuple[Mixer, Ffn]] = {
    "M": (Mixer.MAMBA, Ffn.NONE),
    "*": (Mixer.ATTENTION, Ffn.NONE),
    "-": (Mixer.NONE, Ffn.DENSE),
    "E": (Mixer.NONE, Ffn.MOE),
}
"""hybrid_override_pattern letters (HF NemotronHConfig; Megatron-LM's mamba_hybrid_layer_allocation)."""


@dataclass(frozen=True, order=True)
class LayerKind:
    """What one layer holds. ``sliding`` marks attention over a sliding window only."""

    mixer: Mixer
    ffn: Ffn
    sliding: bool = False

    @property
    def parts(self) -> int:
        """Sub-blocks with their own pre-norm and residual add (1 or 2)."""
        return int(self.mixer != Mixer.NONE) + int(self.ffn != Ffn.NONE)


def check_layout(model: ModelSpec) -> None:
    """MLA, sliding windows and hybrid patterns: all-or-nothing field groups."""
    mla = (model.kv_lora_rank, model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim)
    if any(mla) and not all(mla):
        raise MeshplanError(f"model {model.name!r}: multi-head latent attention needs kv_lora_rank, "
                            "qk_rope_head_dim, qk_nope_head_dim and v_head_dim all set")
    if model.q_lora_rank and not model.kv_lora_rank:
        raise MeshplanError(f"model {model.name!r}: q_lora_rank is set but kv_lora_rank is 0 (not MLA)")
    if model.full_attention_period and not model.sliding_window:
        raise MeshplanError(f"model {model.name!r}: full_attention_period is set but sliding_window is 0")
    if not isinstance(model.hybrid_pattern, str):
        raise MeshplanError(f"model {model.name!r}: hybrid_pattern must be a string")
    if not model.hybrid_pattern:
        if model.mamba_num_heads:
            raise MeshplanError(f"model {model.name!r}: Mamba fields set but hybrid_pattern is empty")
        return
    bad = sorted(set(model.hybrid_pattern) - set(PATTERN_CHARS))
    if bad:
        raise MeshplanError(f"model {model.name!r}: hybrid_pattern letter(s) {''.join(bad)!r} not in "
                            f"{''.join(PATTERN_CHARS)!r}")
    if len(model.hybrid_pattern) != model.num_layers:
        raise MeshplanError(f"model {model.name!r}: hybrid_pattern has {len(model.hybrid_pattern)} "
                            f"letters but num_layers is {model.num_layers}")
    if "E" in model.hybrid_pattern and not model.is_moe:
        raise MeshplanError(f"model {model.name!r}: hybrid_pattern has MoE layers (E) but moe_num_experts is 0")
    if model.moe_dense_layers:
        raise MeshplanError(f"model {model.name!r}: moe_dense_layers does not apply to a hybrid_pattern "
                            "(write the dense layers as '-')")
    if "M" in model.hybrid_pattern and not (model.mamba_num_heads and model.mamba_head_dim
                                           and model.mamba_state_size and model.mamba_groups):
        raise MeshplanError(f"model {model.name!r}: Mamba layers need mamba_num_heads, mamba_head_dim, "
                            "mamba_state_size and mamba_groups")
    if model.mamba_num_heads % max(model.mamba_groups, 1):
        raise MeshplanError(f"model {model.name!r}: mamba_num_heads={model.mamba_num_heads} is not "
                            f"divisible by mamba_groups={model.mamba_groups}")


def layer_kind(model: ModelSpec, layer: int) -> LayerKind:
    """Kind of layer ``layer`` (0-based) of the main stack."""
    if model.hybrid_pattern:
        mixer, ffn = PATTERN_CHARS[model.hybrid_pattern[layer]]
    else:
        mixer = Mixer.ATTENTION
        ffn = Ffn.MOE if model.is_moe and layer >= model.moe_dense_layers else Ffn.DENSE
    return LayerKind(mixer, ffn, mixer == Mixer.ATTENTION and is_sliding(model, layer))


def is_sliding(model: ModelSpec, layer: int) -> bool:
    """GPT-OSS / Gemma style: every ``full_attention_period``-th layer keeps full attention,
    the others attend over ``sliding_window`` tokens (GPT-OSS: period 2, sliding first)."""
    if not model.sliding_window:
        return False
    period = model.full_attention_period
    return not (period and (layer + 1) % period == 0)


def mtp_kind(model: ModelSpec) -> LayerKind:
    """The block inside each multi-token-prediction module (DeepSeek-V3 Sec. 2.2: a full
    Transformer block; attention + MoE for an MoE model, attention + MLP otherwise)."""
    return LayerKind(Mixer.ATTENTION, Ffn.MOE if model.is_moe else Ffn.DENSE)


def layer_kind_counts(model: ModelSpec, start: int = 0, stop: int | None = None
                      ) -> tuple[tuple[LayerKind, int], ...]:
    """Distinct kinds of layers ``start`` to ``stop`` (default: the whole main stack) with how many
    layers hold each, in a fixed order; kinds no layer holds are left out.

    Counted per run of the pattern, not per layer, so a stack of 10^9 layers costs what one of 10
    does: a plain stack is a dense run then an MoE run (``moe_dense_layers``), each split by the
    sliding-window period; a hybrid pattern is counted letter by letter with ``str.count``."""
    stop = model.num_layers if stop is None else stop
    counts: Counter[LayerKind] = Counter()
    if model.hybrid_pattern:
        for letter, (mixer, ffn) in PATTERN_CHARS.items():
            attention = mixer == Mixer.ATTENTION
            full = _full_attention_letters(model, letter, start, stop) if attention else 0
            total = model.hybrid_pattern.count(letter, start, stop)
            counts[LayerKind(mixer, ffn, attention and bool(model.sliding_window))] += total - full
            counts[LayerKind(mixer, ffn, False)] += full
    else:
        moe_from = model.moe_dense_layers if model.is_moe else stop
        for ffn, lo, hi in ((Ffn.DENSE, start, min(stop, max(start, moe_from))),
                            (Ffn.MOE, max(start, moe_from), stop)):
            full = _full_attention_layers(model, lo, hi) if model.sliding_window else max(hi - lo, 0)
            counts[LayerKind(Mixer.ATTENTION, ffn, True)] += max(hi - lo, 0) - full
            counts[LayerKind(Mixer.ATTENTION, ffn, False)] += full
    return tuple(sorted((kind, n) for kind, n in counts.items() if n > 0))


def _full_attention_layers(model: ModelSpec, lo: int, hi: int) -> int:
    """Layers i in [lo, hi) that keep full attention under a sliding window (is_sliding): those
    with (i + 1) a multiple of ``full_attention_period``, none without a period."""
    period = model.full_attention_period
    if hi <= lo or not period:
        return 0
    return hi // period - lo // period


def _full_attention_letters(model: ModelSpec, letter: str, lo: int, hi: int) -> int:
    """Letters ``letter`` at layers i in [lo, hi) of the hybrid pattern that keep full attention
    (every attention layer without a sliding window; else those with (i + 1) % period == 0)."""
    if not model.sliding_window:
        return model.hybrid_pattern.count(letter, lo, hi)
    period = model.full_attention_period
    if not period or hi <= lo:
        return 0
    first = (lo // period + 1) * period - 1  # the first i >= lo with (i + 1) % period == 0
    return model.hybrid_pattern[first:hi:period].count(letter)


# ---- parameters of each part -------------------------------------------------------------

def attention_params(model: ModelSpec) -> int:
    """Standard (GQA) attention, or multi-head latent attention when kv_lora_rank is set."""
    D, N, H = model.hidden_size, model.num_heads, model.head_dim
    if model.is_mla:
        # DeepSeek-V2 Sec. 2.1.2-2.1.3: W^DQ (D x d_c'), norm, W^UQ|W^QR (d_c' x N(d_nope+d_rope));
        # W^DKV|W^KR (D x d_c + d_rope), norm, W^UK|W^UV (d_c x N(d_nope + d_v)); W^O (N d_v x D).
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            p = D * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * N * qk
        else:
            p = D * N * qk
        p += D * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
        p += model.kv_lora_rank * N * (model.qk_nope_head_dim + model.v_head_dim)
        p += N * model.v_head_dim * D
    else:
        p = D * model.q_size + 2 * D * model.kv_size + model.q_size * D
        if model.attn_bias:
            p += model.q_size + 2 * model.kv_size
    if model.mlp_bias:
        p += D  # output projection bias
    if model.qk_norm:
        p += 2 * H  # Qwen3: RMSNorm over each head's q and k (weights shared across heads)
    if model.attention_sinks:
        p += N  # GPT-OSS: one learned sink logit per head
    return p


def mamba_inner(model: ModelSpec) -> int:
    """d_inner = heads x head dim."""
    return model.mamba_num_heads * model.mamba_head_dim


def mamba_in_proj_width(model: ModelSpec) -> int:
    """in_proj output: z and x (d_inner each), B and C (G x N_s each), dt (one per head)."""
    return 2 * mamba_inner(model) + 2 * model.mamba_groups * model.mamba_state_size + model.mamba_num_heads


def mamba_conv_channels(model: ModelSpec) -> int:
    """Channels of the causal depthwise conv: x, B and C (Mamba-2 Sec. 7.1)."""
    return mamba_inner(model) + 2 * model.mamba_groups * model.mamba_state_size


def mamba_params(model: ModelSpec) -> int:
    """Mamba-2 block (Dao & Gu 2024, Sec. 7.1 and Fig. 6): in_proj, conv1d (+ bias), dt_bias,
    A_log and D per head, gated RMSNorm over d_inner, out_proj. No projection biases
    (Nemotron-H: mamba_proj_bias false, use_conv_bias true)."""
    D, n, di = model.hidden_size, model.mamba_num_heads, mamba_inner(model)
    conv = mamba_conv_channels(model) * (model.mamba_conv_width + 1)
    return D * mamba_in_proj_width(model) + conv + 3 * n + di + di * D


def mixer_params(model: ModelSpec, mixer: Mixer) -> int:
    if mixer == Mixer.ATTENTION:
        return attention_params(model)
    if mixer == Mixer.MAMBA:
        return mamba_params(model)
    return 0


def moe_params(model: ModelSpec, active_only: bool) -> tuple[int, int]:
    """(dense part, routed-expert part) of one MoE block: router (+ its bias when mlp_bias),
    shared experts, LatentMoE projections (Nemotron 3 white paper, NVIDIA 2025, Sec. 2.2);
    routed experts all, or the top-k one token uses."""
    experts = model.moe_top_k if active_only else model.moe_num_experts
    router = model.hidden_size * model.moe_num_experts
    if model.mlp_bias:
        router += model.moe_num_experts
    shared = model.moe_shared_experts * model.mlp_params(model.moe_shared_ffn_hidden_size)
    latent = 2 * model.hidden_size * model.moe_latent_size  # LatentMoE D -> l and l -> D
    routed = experts * model.mlp_params(model.moe_ffn_hidden_size, model.moe_latent_size)
    return router + shared + latent, routed


def ffn_params(model: ModelSpec, ffn: Ffn, active_only: bool = False) -> int:
    if ffn == Ffn.DENSE:
        return model.mlp_params(model.ffn_hidden_size)
    if ffn == Ffn.MOE:
        return sum(moe_params(model, active_only))
    return 0


def kind_params(model: ModelSpec, kind: LayerKind, active_only: bool = False) -> int:
    """One layer of this kind: its parts plus one pre-norm per part."""
    return (mixer_params(model, kind.mixer) + ffn_params(model, kind.ffn, active_only)
            + kind.parts * model.norm_params())


def mtp_module_params(model: ModelSpec, active_only: bool = False) -> int:
    """One multi-token-prediction module (DeepSeek-V3 Sec. 2.2): RMSNorms of the hidden state and
    of the next token's embedding, the 2D -> D projection M_k, one block, and the output norm.
    The embedding and output head are shared with the main model (counted there)."""
    D = model.hidden_size
    return 3 * model.norm_params() + 2 * D * D + kind_params(model, mtp_kind(model), active_only)
