"""Megatron-Core's selective recompute by module: what each module drops and what it reruns.

``--recompute-granularity selective --recompute-modules ...`` (``TransformerConfig.recompute_modules``,
megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM@d30c3ae5469fe3f6a64d4fd2e63b6e7f7844ea81)
names submodules of each layer whose activations are not kept for the backward but computed again
there. ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` are checkpointed whole: their input is
kept (it is also the previous op's output, kept anyway), everything inside dropped. ``moe_act``,
``layernorm`` and ``mla_up_proj`` discard their output after its consumers saved what they need
(output-discarding checkpoint) and rerun to restore it.

Per layer and micro-batch on one GPU, in the symbols of ``cost/layer.py`` (T = b*S/c tokens, T_r
the tokens the replicated ops see, T/t with SP, t = tp, D hidden, F the MLP width, k top-k, Fs the
shared experts' summed width, N heads, a the activation bytes, a_l a linear's saved-input bytes,
g = 2 for a gated MLP else 1), the activations each drops (Korthikanti et al. 2022 Table 2 style,
the terms of ``layer.py``'s kept activations):

* core_attn: the attention scores, softmax and dropout, 5as^2b/t (0 with a fused kernel);
* mlp (dense layers): T*F*(g*a + a_l)/t, the MLP's inner tensors (its input stays as the checkpoint's);
* moe (MoE layers): the whole block's inner tensors: T*(k*F + Fs)*(g*a + a_l)/t, the routed token
  copies and the latent projections (the block's input stays);
* moe_act: the routed experts' activation output (fc2's input), T*k*F*a_l/t; it reruns the
  activation, with a clamped GLU's eager clamp and cat (cost/expert_passes.py);
* shared_experts: the shared experts' inner tensors, T*Fs*(g*a + a_l)/t;
* layernorm: both norms' outputs (the next linear's input), 2*T_r*D*a_l;
* mla_up_proj: MLA's query, key and value after the up projections and RoPE, T*N*(2*d_qk + d_v)*a/t
  (the compressed latents stay).

``moe`` covers ``moe_act`` and ``shared_experts`` (nothing is dropped twice). What each reruns in
the backward is its forward: the same GEMMs, memory-bound ops and, for ``mlp`` and ``moe``, the
exposed TP / EP communication of that sub-block again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.cost.expert_passes import clamp_rerun_elements
from meshplan.plan import RecomputeModule
from meshplan.spec.layers import Ffn, LayerKind, Mixer
from meshplan.spec.model import ModelSpec


@dataclass(frozen=True)
class ModuleTerm:
    """One module of one layer kind (arrays over plans, or 0 where the kind has no such module)."""

    dropped_bytes: np.ndarray | float
    """Activations per micro-batch no longer kept for the backward."""
    rerun_s: np.ndarray | float
    """Forward time run again in the backward."""


NOTHING = ModuleTerm(dropped_bytes=0.0, rerun_s=0.0)

SUBSUMED: dict[RecomputeModule, RecomputeModule] = {
    RecomputeModule.MOE_ACT: RecomputeModule.MOE,
    RecomputeModule.SHARED_EXPERTS: RecomputeModule.MOE,
}
"""A module inside another: when both are chosen only the outer one counts."""


def chosen(codes: np.ndarray, module: RecomputeModule) -> np.ndarray:
    """Per plan, whether ``module`` is recomputed: the bit of ``module`` in the plan's code
    (``meshplan.plan.recompute_module_code``), code 0 meaning the attention core alone."""
    codes = np.asarray(codes)
    if module == RecomputeModule.CORE_ATTN:
        return (codes == 0) | ((codes & module.bit) > 0)
    return (codes & module.bit) > 0


def selective(codes: np.ndarray, terms: dict[RecomputeModule, ModuleTerm], act_none_bytes):
    """(kept bytes, rerun seconds) per plan under selective recompute of each plan's modules:
    everything kept without recompute less what the chosen modules drop, and their forwards again."""
    dropped = 0.0 * act_none_bytes
    rerun = 0.0 * act_none_bytes
    for module, term in terms.items():
        on = chosen(codes, module)
        outer = SUBSUMED.get(module)
        if outer is not None:
            on = on & ~chosen(codes, outer)
        dropped = dropped + np.where(on, term.dropped_bytes, 0.0)
        rerun = rerun + np.where(on, term.rerun_s, 0.0)
    return act_none_bytes - dropped, rerun


def selective_columns(codes: np.ndarray, terms: dict[RecomputeModule, ModuleTerm], act_none_bytes):
    """:func:`selective` for every plan under each of ``codes`` (C,): (N, C) arrays, the plan's
    terms costed once (the search's bound over every module set, search/group_prune.py)."""
    column = lambda v: np.asarray(v)[..., None]  # noqa: E731  (N,) -> (N, 1)
    return selective(np.asarray(codes)[None, :],
                     {m: ModuleTerm(column(t.dropped_bytes), column(t.rerun_s)) for m, t in terms.items()},
                     column(act_none_bytes))


def module_terms(model: ModelSpec, kind: LayerKind, calib: Calibration, *, mix, T, T_rep, t, ab, sib, hbm,
                  peak, linear_time, t_mlp, t_attn, per_channel, moe_routed, sub_block_tp_s,
                  ep_s) -> dict[RecomputeModule, ModuleTerm]:
    """What each of Megatron's recompute modules drops and reruns in one layer of ``kind``
    (the formulas above; cost/layer.py passes its layer's terms). ``per_channel``: bytes kept per token and F-wide
    channel inside the MLP / experts (g*a + a_l); ``moe_routed``: the MoE block's routed copies and
    latent tensors;
    ``sub_block_tp_s`` / ``ep_s``: one sub-block's exposed TP and the block's exposed EP time."""
    D = float(model.hidden_size)
    ew = ab / hbm * calib.elementwise_time_factor  # seconds per element read or written
    m_mlp = 3.0 if model.gated_mlp else 2.0  # activation fn: inputs read + output written
    terms = {RecomputeModule.CORE_ATTN: ModuleTerm(mix.score_bytes, t_attn + mix.softmax_bytes / hbm)}
    # both norms' outputs (each the next linear's saved input); a norm reads and writes T_r x D
    terms[RecomputeModule.LAYERNORM] = ModuleTerm(T_rep * D * kind.parts * sib, T_rep * D * kind.parts * 2.0 * ew)
    if kind.mixer == Mixer.ATTENTION and model.is_mla:
        heads = float(model.num_heads) / t
        dqk, dv = float(model.qk_head_dim), float(model.v_dim)
        q_in = float(model.q_lora_rank or model.hidden_size)
        up = (linear_time(calib, peak, T, heads * dqk, q_in)
              + linear_time(calib, peak, T, heads * (model.qk_nope_head_dim + dv), float(model.kv_lora_rank)))
        terms[RecomputeModule.MLA_UP_PROJ] = ModuleTerm(T * ab * heads * (2.0 * dqk + dv), up)
    if kind.ffn == Ffn.DENSE:
        F = float(model.ffn_hidden_size)
        terms[RecomputeModule.MLP] = ModuleTerm(T * per_channel * F / t,
                                                t_mlp + T * m_mlp * F / t * ew + sub_block_tp_s)
    elif kind.ffn == Ffn.MOE:
        kF = float(model.moe_top_k * model.moe_ffn_hidden_size)
        Fs = float(model.moe_shared_experts * model.moe_shared_ffn_hidden_size)
        terms[RecomputeModule.MOE] = ModuleTerm(T * per_channel * (kF + Fs) / t + moe_routed,
                                                t_mlp + T * m_mlp * (kF + Fs) / t * ew + sub_block_tp_s + ep_s)
        # a clamped GLU reruns its eager clamp with the activation (cost/expert_passes.py)
        rerun = m_mlp + clamp_rerun_elements(model, fused_mlp=calib.moe_fused_grouped_mlp)
        terms[RecomputeModule.MOE_ACT] = ModuleTerm(T * kF * sib / t, T * rerun * kF / t * ew)
        if Fs:
            shared = (linear_time(calib, peak, T, (m_mlp - 1.0) * Fs / t, D)
                      + linear_time(calib, peak, T, D, Fs / t))
            terms[RecomputeModule.SHARED_EXPERTS] = ModuleTerm(T * per_channel * Fs / t, shared + T * m_mlp * Fs / t * ew)
    return terms
