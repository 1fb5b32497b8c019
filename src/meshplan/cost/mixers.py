"""Token mixers of one layer (attention: GQA/MHA or multi-head latent; Mamba-2) for many plans.

Each returns a :class:`MixerCost`: its forward GEMM time, its core (attention / SSD scan) FLOPs
and time, the bytes of its unfused score pass, the activations it keeps, and its context-parallel
traffic. Symbols as in cost/layer.py; T tokens on this GPU, t = tp, c = cp, S sequence.

* GQA/MHA: QKV and output projections, cores 2*T*S_eff*N*(d_qk + d_v)/t (QK^T and AV),
  S_eff = min(window, S) for a sliding-window layer (GPT-OSS; Beltagy et al. 2020 Sec. 3.1),
  halved for causal masking when the window is the whole sequence.
* MLA (DeepSeek-V2 Sec. 2.1; Megatron-LM's MLASelfAttention): the down projections W^DQ and
  W^DKV|W^KR are replicated over TP, the up projections and W^O split over heads. Kept: the
  down-projection outputs (replicated), q, k (d_nope + d_rope per head) and v and the core output.
* Mamba-2 (Dao & Gu 2024): in_proj (z, x, B, C, dt) and out_proj split over heads (Megatron's
  MambaMixer TP); the SSD scan with chunk length Q costs per token and forward
  2*(G*Q*N_s + n*Q*P + 2*n*N_s*P) FLOPs (Sec. 6: the diagonal blocks C B^T and their product
  with X, the chunk states B^T X and their output C h), plus 2*W per conv channel. Kept: in_proj
  output, conv output, scan output y and gated-norm output (Korthikanti et al. 2022's accounting
  applied to the block's tensors). Context parallel: an all-to-all of the in_proj output (to
  head-sharded) and of y back (Megatron-LM's Mamba context parallel), with either cp_method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.arrays import CP_RING, PlanArrays
from meshplan.cost.band_mask import band_kernel_keys
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_efficiency
from meshplan.cost.packing import DocAttention
from meshplan.cost.torch_cp import torch_cp_cost
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.layers import (
    LayerKind,
    Mixer,
    mamba_conv_channels,
    mamba_in_proj_width,
    mamba_inner,
)
from meshplan.spec.model import Arch, ModelSpec


@dataclass(frozen=True)
class MixerCost:
    gemm_s: np.ndarray
    """Forward projection GEMMs."""
    core_s: np.ndarray
    """Forward attention core / SSD scan math (what selective recompute repeats, with the
    softmax pass)."""
    core_bwd_s: np.ndarray
    """Backward of the core: Calibration.attention_backward_ratio x the forward at the backward
    kernel's own sequence falloff (2 x core_s by default; the SSD scan: 2 x)."""
    softmax_bytes: np.ndarray | float
    """HBM bytes of an unfused softmax pass (0 when fused)."""
    kept_bytes: np.ndarray
    """Activations kept for the backward inside the TP region (per GPU)."""
    score_bytes: np.ndarray | float
    """Kept s x s scores of unfused attention (dropped by selective recompute)."""
    cp_fwd_s: np.ndarray | float
    cp_bwd_s: np.ndarray | float
    cp_overlap: np.ndarray | float
    torch_cp: np.ndarray | bool = False
    """Plans whose CP runs as torch's ring attention (cost/torch_cp.py): their exposed CP time is
    cp_fwd_exposed_s / cp_bwd_exposed_s, as torch issues the collectives, not cp_overlap's."""
    cp_fwd_exposed_s: np.ndarray | float = 0.0
    cp_bwd_exposed_s: np.ndarray | float = 0.0


def mixer_cost(model: ModelSpec, cluster: ClusterSpec, kind: LayerKind, plans: PlanArrays,
               calib: Calibration, *, seq_len: int, peak: float, hbm: float, ab: float,
               gemm_time, core_peak: float | None = None, docs: DocAttention | None = None,
               docs_bwd: DocAttention | None = None) -> MixerCost:
    """``peak`` is the projections' rate, ``core_peak`` the attention core's / scan's (bf16 under
    an fp8 recipe unless fp8 attention: cost/precision.py); ``gemm_time`` costs a projection;
    ``docs`` the packed documents' attention factors (cost/packing.py), None: full sequences;
    ``docs_bwd`` the same at the backward kernel's falloff (default: ``docs``)."""
    core_peak = peak if core_peak is None else core_peak
    zero = np.zeros(len(plans.tp))
    if kind.mixer == Mixer.NONE:
        return MixerCost(zero, zero, zero, 0.0, zero, 0.0, 0.0, 0.0, 0.0)
    if kind.mixer == Mixer.MAMBA:
        return _mamba(model, cluster, plans, calib, S=float(seq_len), peak=peak, ab=ab, gemm_time=gemm_time,
                      core_peak=core_peak)
    return _attention(model, cluster, kind, plans, calib, S=float(seq_len), peak=peak, hbm=hbm, ab=ab,
                      gemm_time=gemm_time, core_peak=core_peak, docs=docs,
                      docs_bwd=docs if docs_bwd is None else docs_bwd)


def attention_core_efficiency(calib: Calibration, head_dim: float, kv_len, causal: bool, backward: bool = False):
    """Fraction of peak a fused attention kernel reaches: the large-problem efficiency, times the
    head-dim falloff H / (H + Calibration.attention_half_head_dim), times the sequence falloff
    s / (s + s_half) with the KV length one kernel call sees (causal masks ramp up later;
    FlashAttention-3 curves, Shah et al. 2024 Fig. 5), times the unaligned-head-dim factor.
    ``backward``: the backward kernel's falloff (Calibration.attention_backward_half_seq*)."""
    aligned = calib.unaligned_matmul_factor if head_dim % 8 else 1.0  # model constant
    half_seq = attention_half_seq(calib, causal, backward)
    return (calib.attention_efficiency * head_dim / (head_dim + calib.attention_half_head_dim)
            * kv_len / (kv_len + half_seq) * aligned)


def attention_exp_factor(calib: Calibration, sfu_exp_per_s: float, head_dim: float, backward: bool = False):
    """The attention core's time on a GPU of SFU rate ``sfu_exp_per_s`` at ``head_dim`` over its
    time at Calibration.attention_exp_reference_per_s and head dim 128. A kernel computes one
    exponential per score (P = exp(S - m)) and 4 x head_dim FLOPs of MMA per score (QK^T, PV:
    Dao 2023 Algorithm 1), so the exponentials' time over the MMA's, s / (1 - s) at the reference,
    scales with 128 / head_dim and with reference / rate: 1 - s + s x (128 / head_dim) x
    (reference / rate) (NVIDIA blog 'Making Softmax More Efficient with NVIDIA Blackwell Ultra',
    2026: BMM2 waits for the SFUs). 1 where either rate is unknown (0)."""
    if sfu_exp_per_s <= 0 or calib.attention_exp_reference_per_s <= 0:
        return 1.0
    share = calib.attention_backward_exp_share if backward else calib.attention_exp_share
    per_score = calib.attention_exp_reference_head_dim / head_dim  # exps per MMA FLOP, relative
    return 1.0 - share + share * per_score * calib.attention_exp_reference_per_s / sfu_exp_per_s


def attention_half_seq(calib: Calibration, causal: bool, backward: bool = False) -> float:
    """KV length at which the forward (backward) attention kernel reaches half its efficiency."""
    if backward:
        return calib.attention_backward_half_seq_causal if causal else calib.attention_backward_half_seq
    return calib.attention_half_seq_causal if causal else calib.attention_half_seq


def cp_causal_imbalance(calib: Calibration, c, causal: bool):
    """Attention work of the busiest CP rank over the mean: 1 with the load-balanced (zig-zag)
    split; (2c-1)/c with a contiguous split of a causal sequence: of the c x c blocks of S/c
    queries by S/c keys, rank i computes i + 1/2 (its diagonal block half masked), the last
    c - 1/2 against c/2 on average (Megatron-Core context parallel docs: the load-balanced split).
    """
    if not causal or calib.cp_causal_balanced:
        return np.ones_like(c)
    return (2.0 * c - 1.0) / c


def _attention(model, cluster, kind, plans, calib, *, S, peak, hbm, ab, gemm_time, core_peak, docs=None,
               docs_bwd=None) -> MixerCost:
    t = plans.tp.astype(float)
    c = plans.cp.astype(float)
    D = float(model.hidden_size)
    N = float(model.num_heads)
    T = plans.micro_batch * S / c
    heads_local = N / t
    dqk, dv = float(model.qk_head_dim), float(model.v_dim)
    if model.is_mla:
        rope, nope = float(model.qk_rope_head_dim), float(model.qk_nope_head_dim)
        q_lora, kv_lora = float(model.q_lora_rank), float(model.kv_lora_rank)
        down = q_lora + kv_lora + rope  # replicated over TP
        t_in = gemm_time(calib, peak, T, down, D)
        t_in = t_in + (gemm_time(calib, peak, T, heads_local * dqk, q_lora) if q_lora
                       else gemm_time(calib, peak, T, heads_local * dqk, D))
        t_in = t_in + gemm_time(calib, peak, T, heads_local * (nope + dv), kv_lora)
        kv_local = heads_local * (dqk + dv) / 2.0  # per-rank K and V widths, averaged
        kept = T * ab * (down + heads_local * (2 * dqk + 2 * dv))  # down outputs, q, k, v, core out
    else:
        H = float(model.head_dim)
        kv_local = np.maximum(model.num_kv_heads / t, 1.0) * H  # KV heads replicate when t > K
        t_in = gemm_time(calib, peak, T, model.q_size / t + 2 * kv_local, D)
        kept = T * ab * (2 * model.q_size + 2 * kv_local * t) / t  # Q, core out, K, V
    t_out = gemm_time(calib, peak, T, D, heads_local * dv)
    window = float(model.sliding_window) if kind.sliding else S
    s_eff = min(window, S)
    is_causal = model.arch == Arch.DECODER and s_eff >= S
    causal = 0.5 if is_causal else 1.0
    core_flops = 2.0 * T * s_eff * heads_local * (dqk + dv) * causal
    head_dim = (dqk + dv) / 2.0
    is_ring = plans.cp_method == CP_RING
    if calib.fused_attention:
        # KV length of one kernel call: ring CP runs c blocks of S/c keys, Ulysses the whole S
        kv_len = np.where(is_ring & (c > 1), np.minimum(s_eff, S / c), s_eff)
        masked, kernel_flops = is_causal, core_flops
        if model.arch == Arch.DECODER and s_eff < S:  # a causal band: w + B keys at the causal rate
            kernel_flops = core_flops * band_kernel_keys(s_eff, S) / s_eff  # (cost/band_mask.py)
            kv_len, masked = np.where(is_ring & (c > 1), S / c, S), True
        sfu = cluster.gpu.sfu_exp_per_s
        t_core = (kernel_flops / (core_peak * attention_core_efficiency(calib, head_dim, kv_len, masked))
                  * attention_exp_factor(calib, sfu, head_dim))
        t_bwd = calib.attention_backward_ratio * attention_exp_factor(calib, sfu, head_dim, backward=True) * (
            kernel_flops / (core_peak * attention_core_efficiency(calib, head_dim, kv_len, masked, backward=True)))
        softmax_bytes, score_bytes = 0.0, 0.0
    else:  # two batched GEMMs over the full s x s scores + a softmax pass (Megatron masks, not skips)
        t_core = core_flops / causal / (core_peak * gemm_efficiency(calib, S, s_eff, head_dim))
        t_bwd = calib.attention_backward_ratio * t_core
        scores = plans.micro_batch * heads_local * (S / c) * s_eff
        softmax_bytes = scores * (2.0 + (3.0 if calib.dropout else 0.0)) * ab
        # softmax output (2 B), + dropout mask (1 B) and dropout output: the 5as^2b term
        score_bytes = scores * (ab + ((1.0 + ab) if calib.dropout else 0.0))
    cp_link = comms.group_link(cluster, calib, plans.cp, plans.tp)
    kv_msg = T * 2 * kv_local * ab  # this rank's K and V chunk
    ring = (c - 1) * comms.p2p_time(kv_msg, c > 1, cp_link)
    # Ulysses (Jacobs et al. 2023): all-to-all of Q, K, V in and of the output back.
    ulysses = comms.all_to_all_time(T * (heads_local * (dqk + dv) + 2 * kv_local) * ab, c, cp_link)
    cp_share = 1.0
    if docs is not None and calib.fused_attention and s_eff >= S:
        # Document masks: a varlen kernel computes each document's block only; the factor holds
        # the zig-zag imbalance of the documents and the busiest dp rank (cost/packing.py).
        # Unfused attention masks the full S x S scores and a sliding window caps the work
        # already: both keep the full-sequence time.
        t_core = t_core * docs.core_factor
        t_bwd = t_bwd * docs_bwd.core_factor
        cp_share = docs.cp_token_share
    else:
        t_core = t_core * cp_causal_imbalance(calib, c, is_causal)
        t_bwd = t_bwd * cp_causal_imbalance(calib, c, is_causal)
    ring, ulysses = ring * cp_share, ulysses * cp_share
    cp_fwd, cp_bwd = np.where(is_ring, ring, ulysses), np.where(is_ring, 2 * ring, ulysses)
    torch_cp, fwd_exp, bwd_exp = False, 0.0, 0.0
    if calib.cp_ring_gathers_kv and calib.fused_attention and is_causal and docs is None:
        # torch's ring attention (torchtitan): its blocks, merge, fp32 accumulation and
        # collectives as it issues them (cost/torch_cp.py), on causal full sequences.
        torch_cp = is_ring & (c > 1)
        tc = torch_cp_cost(c=c, micro_batch=plans.micro_batch, seq_len=S, heads=heads_local, dqk=dqk, dv=dv,
                           ab=ab, core_peak=core_peak, hbm=hbm, bwd_ratio=calib.attention_backward_ratio,
                           efficiency=lambda kv, causal_, bwd: attention_core_efficiency(
                               calib, head_dim, kv, causal_, backward=bwd),
                           cp_link=cp_link, eager=calib.eager_memory_passes)
        t_core, t_bwd = np.where(torch_cp, tc.core_s, t_core), np.where(torch_cp, tc.core_bwd_s, t_bwd)
        cp_fwd, cp_bwd = np.where(torch_cp, tc.fwd_comm_s, cp_fwd), np.where(torch_cp, tc.bwd_comm_s, cp_bwd)
        fwd_exp, bwd_exp = tc.fwd_exposed_s, tc.bwd_exposed_s
    return MixerCost(
        gemm_s=t_in + t_out, core_s=t_core, core_bwd_s=t_bwd, softmax_bytes=softmax_bytes,
        kept_bytes=kept, score_bytes=score_bytes, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd,
        cp_overlap=np.where(is_ring, calib.cp_overlap, 0.0), torch_cp=torch_cp,
        cp_fwd_exposed_s=fwd_exp, cp_bwd_exposed_s=bwd_exp)


def _mamba(model, cluster, plans, calib, *, S, peak, ab, gemm_time, core_peak) -> MixerCost:
    t = plans.tp.astype(float)
    c = plans.cp.astype(float)
    D = float(model.hidden_size)
    T = plans.micro_batch * S / c
    di = float(mamba_inner(model))
    t_in = gemm_time(calib, peak, T, mamba_in_proj_width(model) / t, D)
    t_out = gemm_time(calib, peak, T, D, di / t)
    n, P = float(model.mamba_num_heads), float(model.mamba_head_dim)
    G, Ns, Q = float(model.mamba_groups), float(model.mamba_state_size), float(model.mamba_chunk_size)
    scan_flops = 2.0 * T * (G * Q * Ns + n * Q * P + 2.0 * n * Ns * P) / t
    conv_flops = 2.0 * T * model.mamba_conv_width * mamba_conv_channels(model) / t
    # The SSD kernels at their own fraction of peak (Calibration.mamba_scan_efficiency).
    t_core = (scan_flops + conv_flops) / (core_peak * calib.mamba_scan_efficiency)
    kept = T * ab * (mamba_in_proj_width(model) + mamba_conv_channels(model) + 2 * di) / t
    # Context parallel (Megatron's Mamba CP): all-to-all of the in_proj output from sequence- to
    # head-sharded before the conv and scan, and of y back, whatever cp_method the attention uses.
    cp_link = comms.group_link(cluster, calib, plans.cp, plans.tp)
    a2a = comms.all_to_all_time(T * (mamba_in_proj_width(model) + di) / t * ab, c, cp_link)
    return MixerCost(gemm_s=t_in + t_out, core_s=t_core, core_bwd_s=2.0 * t_core, softmax_bytes=0.0, kept_bytes=kept,
                     score_bytes=0.0, cp_fwd_s=a2a, cp_bwd_s=a2a, cp_overlap=0.0)

