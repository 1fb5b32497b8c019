"""Cost of ONE transformer layer for one micro-batch on one GPU, for many plans at once.

Symbols (spec/model.py): b micro-batch, S sequence, L layers, D hidden, N/K query/KV heads,
H head dim, q = N*H, kv = K*H, F FFN width, V vocab, E experts, k top-k; t = tp, c = cp.
Each GPU of a CP rank holds T = b*S/c tokens; TP splits the weights (Shoeybi et al. 2019).

FLOPs (one forward; backward = 2x forward, Narayanan et al. 2021 Sec. 5.1):
  matmuls   2*T*(D*(q + 2kv) + q*D + m*D*F) / t     (m = 3 gated SwiGLU, 2 plain GELU MLP)
  attention 4*T*S*q / t, halved for causal masking (only the lower triangle is computed by
            fused attention kernels; Dao 2023 Sec. 3.1.1)
Memory-bound ops (norms, residual adds, activation function, dropout, unfused softmax) are
costed from the bytes they read and write over the HBM bandwidth.

Activations kept per layer and micro-batch (Korthikanti et al. 2022, Sec. 4.1, fp16): with no
parallelism sbh(34 + 5as/h); the 24 sbh inside the TP regions and the 5as^2b attention scores
split over t, the 10 sbh around them split over t only with sequence parallel. Generalised
here to GQA (K and V are 2kv bytes per token, not 2D each) and SwiGLU (3 kept F-wide tensors,
not 2), without dropout masks unless ``Calibration.dropout``, and without the s^2 scores under
``Calibration.fused_attention``. Selective recompute drops the scores (Sec. 5); full recompute
keeps only the layer input, 2sbh (/t with SP).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from meshplan.cost import comms
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_efficiency, gemm_time  # noqa: F401 (re-exported)
from meshplan.cost.eager_passes import eager_extra_bytes, repeat_kv_bytes, runs_eager
from meshplan.cost.host import (BACKWARD_KERNELS_PER_FORWARD, host_bound, host_launch_s, host_runs_apart,
                               moe_sync_charged)
from meshplan.cost.mixers import attention_half_seq, mixer_cost
from meshplan.cost.expert_load import replica_factor
from meshplan.cost.moe import moe_cost
from meshplan.cost.op_recompute import op_selective
from meshplan.cost.recompute_modules import module_terms, selective, selective_columns
from meshplan.cost.packing import DocAttention, doc_attention
from meshplan.cost.tp_backward import tp_backward
from meshplan.cost.precision import bf16_layer_fraction, op_rates, saved_input_bytes, tp_gather_bytes_per_element
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.layers import (
    Ffn,
    LayerKind,
    ffn_params,
    layer_kind_counts,
    mixer_params,
    moe_params,
)
from meshplan.spec.model import Arch, ModelSpec
from meshplan.spec.seqlen import DocBalance
from meshplan.spec.training import Precision, TrainingSpec
# bytes per element and per parameter (cost/state_bytes.py), re-exported for the cost modules
from meshplan.cost.state_bytes import (activation_bytes, optimizer_state_bytes_per_param,  # noqa: F401
                                       param_bytes_per_param, state_bytes)


@dataclass(frozen=True)
class LayerCost:
    """Per-plan arrays for one average transformer layer, one micro-batch, one GPU."""

    fwd_compute_s: np.ndarray
    """Forward math + memory-bound time (no communication)."""
    bwd_compute_s: np.ndarray
    fwd_comm_exposed_s: np.ndarray
    """TP, CP and EP communication of the forward left on the critical path."""
    bwd_comm_exposed_s: np.ndarray
    fwd_comm_total_s: np.ndarray
    """All TP/CP/EP communication time of the forward, hidden or not."""
    bwd_comm_total_s: np.ndarray
    """The same for the backward (TP/EP: the forward's collectives again; CP ring: K/V and dK/dV)."""
    recompute_selective_s: np.ndarray
    """Extra backward-time work of selective recompute (attention core forward again)."""
    recompute_full_s: np.ndarray
    """Extra backward-time work of full recompute (the whole forward again, comms included)."""
    params_per_gpu: np.ndarray
    """Parameters of this layer held on one GPU before ZeRO sharding (after TP and EP)."""
    dense_params_per_gpu: np.ndarray
    """Of which not expert weights (sharded over dp_shard*cp by ZeRO)."""
    state_bytes: np.ndarray
    """Weights + gradients + optimizer states of this layer on one GPU after ZeRO sharding."""
    act_none_bytes: np.ndarray
    act_selective_bytes: np.ndarray
    act_full_bytes: np.ndarray
    tp_exposed_s: np.ndarray
    """Of fwd_comm_exposed_s + bwd_comm_exposed_s: the tensor-parallel collectives (the rest of
    that sum is cp_exposed_s, ep_exposed_s and the runtime's per-layer host overhead)."""
    cp_exposed_s: np.ndarray
    ep_exposed_s: np.ndarray

    @property
    def fwd_s(self) -> np.ndarray:
        return self.fwd_compute_s + self.fwd_comm_exposed_s

    @property
    def bwd_s(self) -> np.ndarray:
        return self.bwd_compute_s + self.bwd_comm_exposed_s


def _layer_params(model: ModelSpec, kind: LayerKind):
    """(dense part, routed-expert part) of one layer's parameters."""
    dense = mixer_params(model, kind.mixer) + kind.parts * model.norm_params()
    if kind.ffn == Ffn.MOE:
        shared, experts = moe_params(model, active_only=False)
        return dense + shared, experts
    return dense + ffn_params(model, kind.ffn), 0


def framework_overhead_s(calib: Calibration, plans: PlanArrays):
    """Per layer and micro-batch, forward + backward: the tp, cp and ZeRO-2/3 per-layer overheads
    of the runtime's path (Calibration), each times (group size - 1). 0 when none is set."""
    if not (calib.tp_layer_overhead_s or calib.cp_layer_overhead_s or calib.fsdp_layer_overhead_s):
        return 0.0
    t, c = plans.tp.astype(float), plans.cp.astype(float)
    shards = plans.dp_shard * c  # ZeRO shards over dp_shard x cp (torchtitan)
    return ((t - 1) * calib.tp_layer_overhead_s + (c - 1) * calib.cp_layer_overhead_s
            + np.where(plans.zero >= 2, (shards - 1) * calib.fsdp_layer_overhead_s, 0.0))


def layer_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               plans: PlanArrays, calib: Calibration,
               kinds: tuple[tuple[LayerKind, int], ...] | None = None,
               module_codes: np.ndarray | None = None) -> LayerCost:
    """The average layer of the stack: each kind of layer (spec/layers.py: attention + MLP, MoE,
    leading dense layers, sliding-window layers, Mamba-2, ...) costed once and weighted by how many
    layers hold it, so that ``num_layers`` times it gives the stack's exact totals of time,
    parameters and memory. ``kinds``: (kind, count) pairs to average over instead of the main
    stack's (cost/rank_layers.py: the leading dense layers, the other layers, an MTP block), which
    is how a pipeline rank is charged for the kinds it holds. ``module_codes`` (C,): the selective
    fields (``recompute_selective_s``, ``act_selective_bytes``) come out (N, C), one column per
    module code in place of ``plans.recompute_modules`` (which no other field reads), so that a
    caller wanting every module set (the search's group bounds) costs each row once."""
    kinds = kinds or layer_kind_counts(model)
    bf16_share = bf16_layer_fraction(training, calib, model.num_layers)
    if bf16_share > 0:  # fp4 recipes keep the first and last layers in bf16 (cost/precision.py)
        lowp = layer_cost(model, cluster, training, plans, calib.replace_fields(fp4_bf16_edge_layers=0.0), kinds,
                          module_codes)
        bf16 = layer_cost(model, cluster, replace(training, precision=Precision.BF16, recipe=None), plans, calib,
                          kinds, module_codes)
        return LayerCost(**{f: (1.0 - bf16_share) * getattr(lowp, f) + bf16_share * getattr(bf16, f)
                            for f in LayerCost.__dataclass_fields__})
    docs = packed_documents(model, training, plans, calib)
    causal = model.arch == Arch.DECODER
    docs_bwd = docs if attention_half_seq(calib, causal, backward=True) == attention_half_seq(calib, causal) \
        else packed_documents(model, training, plans, calib, backward=True)
    if len(kinds) == 1:
        return _one_layer(model, cluster, training, plans, calib, kinds[0][0], docs, docs_bwd, module_codes)
    total = sum(n for _, n in kinds)
    costs = [(_one_layer(model, cluster, training, plans, calib, kind, docs, docs_bwd, module_codes), n / total)
             for kind, n in kinds]
    return LayerCost(**{f: sum(w * getattr(cost, f) for cost, w in costs)
                        for f in LayerCost.__dataclass_fields__})


def packed_documents(model: ModelSpec, training: TrainingSpec, plans: PlanArrays,
                     calib: Calibration, backward: bool = False) -> DocAttention | None:
    """The attention factors of the training's packed documents (cost/packing.py); None when every
    sequence is one document. The varlen kernel's half-efficiency length is the attention's
    (``backward``: the backward kernel's)."""
    if training.seq_len_dist is None:
        return None
    causal = model.arch == Arch.DECODER
    half = attention_half_seq(calib, causal, backward)
    return doc_attention(training.seq_len_dist, seq_len=training.seq_len, global_batch=training.global_batch,
                         dp=plans.dp, cp=plans.cp, half_seq=half, causal=causal,
                         balanced=training.doc_balance == DocBalance.BALANCED, buckets=training.cp_buckets,
                         ideal=training.doc_balance == DocBalance.IDEAL)


def _one_layer(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               plans: PlanArrays, calib: Calibration, kind: LayerKind,
               docs: DocAttention | None = None, docs_bwd: DocAttention | None = None,
               module_codes: np.ndarray | None = None) -> LayerCost:
    gpu = cluster.gpu
    rates = op_rates(cluster, training, calib)  # precision per operation (cost/precision.py)
    peak = rates.linear_flops
    hbm = gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency
    cast = rates.cast_bytes_per_element

    def linear_time(calib_, peak_, m, n, k):
        """A linear layer's GEMM with its fp8/fp4 casts: the input (m x k) in the forward, the
        output gradient (m x n) in the backward; a third here, the backward is 2x the forward."""
        if not cast:  # bf16 / fp16 / fp32: no casts (and no array work for the search)
            return gemm_time(calib_, peak_, m, n, k)
        return gemm_time(calib_, peak_, m, n, k) + cast * (m * k + m * n) / (3.0 * hbm)
    t = plans.tp.astype(float)
    c = plans.cp.astype(float)
    ep = plans.ep.astype(float)
    e_t = plans.etp.astype(float)  # expert tp (Megatron's MoE parallel folding); = t by default
    sp = plans.sp
    S = float(training.seq_len)
    D = float(model.hidden_size)
    T = plans.micro_batch * S / c  # (b*S/c) tokens on this GPU
    T_rep = np.where(sp, T / t, T)  # tokens seen by the replicated ops (norms, residual, dropout)
    m_mlp = 3.0 if model.gated_mlp else 2.0
    ab = activation_bytes(training.precision)  # bytes per activation element
    parts = float(kind.parts)  # sub-blocks, each with a pre-norm, a residual add, a TP f/g pair
    moe = kind.ffn == Ffn.MOE

    # ---- forward math: token mixer, then channel mixer (per GPU shapes) ---------------------
    mix = mixer_cost(model, cluster, kind, plans, calib, seq_len=training.seq_len, peak=peak, hbm=hbm,
                     ab=ab, gemm_time=linear_time, core_peak=rates.core_flops, docs=docs, docs_bwd=docs_bwd)
    if moe:
        block = moe_cost(model, cluster, training, plans, calib, T=T, hbm=hbm, ab=ab,
                         bf16_flops=rates.bf16_flops, linear_flops=peak, gemm_time=gemm_time,
                         linear_time=linear_time)
        t_mlp, mlp_width = block.compute_s, block.kept_width
    elif kind.ffn == Ffn.DENSE:
        F = float(model.ffn_hidden_size)
        t_mlp = linear_time(calib, peak, T, (m_mlp - 1) * F / t, D) + linear_time(calib, peak, T, D, F / t)
        mlp_width = F
    else:
        t_mlp, mlp_width = 0.0 * T, 0.0
    t_attn = mix.core_s  # attention core / SSD scan

    # ---- memory-bound elementwise ops (bytes read + written) ---------------------------
    drop = 2.5 if calib.dropout else 0.0  # per sub-block dropout: read, write, half-size mask
    rep_elems = T_rep * D * parts * (2.0 + 3.0 + drop)  # per sub-block: norm (r+w), residual (2r+1w)
    act_elems = T * mlp_width / t * (m_mlp)  # activation fn: read 1-2 inputs, write 1 output
    t_mem = (rep_elems + act_elems) * ab / hbm * calib.elementwise_time_factor + mix.softmax_bytes / hbm
    if runs_eager(cluster, calib):  # eager model code: more passes than one per op (cost/eager_passes.py)
        t_mem = t_mem + eager_extra_bytes(model, kind, tokens=T, tokens_replicated=T_rep, tp=t,
                                          ab=ab) / hbm * calib.elementwise_time_factor
    elif calib.repeat_kv_copy:  # compiled model code still copies K / V per query head (Calibration)
        t_mem = t_mem + repeat_kv_bytes(model, kind, tokens=T, tp=t, ab=ab) / hbm * calib.elementwise_time_factor
    # Fixed per-layer, per-micro-batch overhead (launches, dispatch): see Calibration; none
    # where the whole iteration replays as one CUDA graph (the host issues no kernel of it).
    # With layer_overhead_on_host, on a GPU it is host time, spent while the device runs the
    # queue (PyTorch CUDA semantics, 'Asynchronous execution', pytorch.org/docs/stable/notes/
    # cuda.html): like the kernels' launches (cost/host.py) it paces a layer only past the
    # layer's device time, so a large layer hides it at any micro-batch; else (and on a CPU
    # device, host and device one) it adds to the device time.
    overhead = 0.0 if calib.cuda_graph_full_iteration else calib.layer_overhead_s
    on_host = calib.layer_overhead_on_host and host_runs_apart(cluster)
    device_overhead = 0.0 if on_host else overhead
    fwd_device = mix.gemm_s + t_mlp + t_attn + t_mem + device_overhead
    # The host issues the layer's kernels while the device runs them: the slower sets the pace.
    host_fwd, host_bwd = host_launch_s(model, cluster, kind, plans, calib, training)
    if on_host:  # the backward, like its math and its launches, 2x
        host_fwd = host_fwd + overhead
        host_bwd = host_bwd + BACKWARD_KERNELS_PER_FORWARD * overhead
    # A graphed step is sync-free (Calibration), and so is a token-drop run padded to capacity:
    # its all-to-all splits are fixed (Megatron-Core's alltoall dispatcher with
    # --moe-pad-expert-input-to-capacity, which Megatron-Bridge's token-drop runs set, leaves its
    # cuda_sync_point at "no_sync"); a capacity factor is read as padded.
    # (DeepEP: Calibration.moe_flex_host_sync; cost/host.py moe_sync_charged)
    if moe and moe_sync_charged(training, calib):
        # The dropless all-to-all's host sync of the token counts drains the launch queue once
        # per MoE layer; up to the next layer's sync the host launches this layer's MoE block
        # (Calibration.moe_alltoall_sync_s; the backward, like its math, 2x) and the next layer's
        # norm, attention and router (cost/host.py): the whole layer waits for it, not the block.
        host_fwd = host_fwd + calib.moe_alltoall_sync_s
        host_bwd = host_bwd + 2.0 * calib.moe_alltoall_sync_s
    fwd_compute = host_bound(fwd_device, host_fwd)

    # ---- communication of the forward -------------------------------------------------
    act_msg = T * D * ab  # (b, S/c, D) activation
    # SP's all-gathers in fp8 where the stack casts before gathering (torchtitan's float8 TP)
    gather_msg = T * D * tp_gather_bytes_per_element(training, calib, ab)
    tp_link = comms.group_link(cluster, calib, plans.tp, 1)
    # Megatron f/g: one all-reduce per sub-block forward; with SP an all-gather + a
    # reduce-scatter moving the same bytes (Korthikanti et al. 2022 Sec. 4.2.2).
    tp_comm = np.where(
        sp,
        parts * (comms.all_gather_time(gather_msg, t, tp_link, "tp_all_gather")
                 + comms.reduce_scatter_time(act_msg, t, tp_link, "tp_reduce_scatter")),
        parts * comms.all_reduce_time(act_msg, t, tp_link),
    )
    cp_fwd, cp_bwd, cp_overlap = mix.cp_fwd_s, mix.cp_bwd_s, mix.cp_overlap
    if moe:
        ep_fwd = block.dispatch_s  # dispatch + combine per the dispatcher (cost/moe.py)
    else:
        ep_fwd = np.zeros_like(T)
    # Smaller messages reach less of the link's bandwidth (Calibration.comm_half_message_bytes).
    tp_comm = tp_comm * (1.0 + calib.comm_half_message_bytes / act_msg)
    # Host time of the runtime's collectives beyond alpha-beta (Calibration.*_layer_overhead_s),
    # never overlapped; a third in the forward, two thirds in the backward, like the math.
    framework = framework_overhead_s(calib, plans)
    # TP collectives overlap the layer's own GEMMs (chunked userbuffers, async TP): device math,
    # not the host's launch time (cost/host.py). Hidden behind a host-bound layer's wait as well,
    # they and FSDP's traffic (dp_comm.py) would both shrink with it, and a larger host cost could
    # make the step faster. EP's all-to-all overlaps another micro-batch's whole layer, its wait
    # for the host included (1F1B A2A overlap, Calibration.ep_overlap).
    tp_exp = comms.exposed(tp_comm, calib.tp_overlap, fwd_device)
    cp_exp = np.where(mix.torch_cp, mix.cp_fwd_exposed_s, comms.exposed(cp_fwd, cp_overlap, t_attn))
    ep_exp = comms.exposed(ep_fwd, calib.ep_overlap, fwd_compute)
    fwd_comm_exposed = tp_exp + cp_exp + ep_exp + framework / 3.0
    fwd_comm_total = tp_comm + cp_fwd + ep_fwd + framework / 3.0
    # Backward: twice the math; the TP/EP collectives again, CP ring passes K/V and dK/dV.
    # The attention core's backward has its own measured ratio (Calibration.attention_backward_ratio):
    # exactly 2 x fwd_compute at the default.
    bwd_device = 2.0 * fwd_device + (mix.core_bwd_s - 2.0 * t_attn)
    if moe:  # the experts' eager passes move other bytes backward than 2x forward (cost/expert_passes.py)
        bwd_device = bwd_device + block.bwd_extra_s
    bwd_compute = host_bound(bwd_device, host_bwd)
    # the forward's collectives' conjugates, SP's input re-gather, Megatron-LM's async ones (cost/tp_backward.py)
    tp_bwd = tp_backward(calib, sp=sp, parts=parts, act_msg_bytes=act_msg, gather_msg_bytes=gather_msg,
                         tp=t, tp_link=tp_link,
                         bwd_device_s=bwd_device, gemm_s=mix.gemm_s + t_mlp)
    tp_exp_bwd = tp_bwd.exposed_s
    cp_exp_bwd = np.where(mix.torch_cp, mix.cp_bwd_exposed_s, comms.exposed(cp_bwd, cp_overlap, mix.core_bwd_s))
    ep_exp_bwd = comms.exposed(ep_fwd, calib.ep_overlap, bwd_compute)
    bwd_comm_exposed = tp_exp_bwd + cp_exp_bwd + ep_exp_bwd + framework * (2.0 / 3.0)
    op_sel = (op_selective(model, kind, tokens=T, tokens_replicated=T_rep, tp=t, sp=sp, ab=ab)
              if calib.op_selective_recompute else None)
    if op_sel is None:  # Megatron's selective: the attention core again (Korthikanti et al. 2022 Sec. 5)
        rec_sel = t_attn + mix.softmax_bytes / hbm
    else:  # op-level: the unsaved mms and every memory-bound op again, the attention kernel saved
        rec_sel = (op_sel.mixer_recomputed_share * mix.gemm_s + op_sel.ffn_recomputed_share * t_mlp
                   + t_mem + device_overhead)
    rec_full = fwd_compute + fwd_comm_exposed

    # ---- parameters and states ----------------------------------------------------------
    dense_p, expert_p = _layer_params(model, kind)
    dense_g = dense_p / t
    expert_g = expert_p / (e_t * ep)
    if moe:  # hot-expert replicas hold whole experts too (cost/expert_load.py)
        expert_g = expert_g * replica_factor(model.moe_num_experts, plans.ep, plans.expert_replicas)
    shard = (plans.dp_shard * plans.cp).astype(float)
    states = (state_bytes(calib, training, dense_g, plans.zero, shard)
              + state_bytes(calib, training, expert_g, plans.zero, np.maximum(shard * t / (e_t * ep), 1.0)))

    # ---- activations (Korthikanti et al. 2022 Sec. 4.1, generalised; bytes) ------------
    drop_masks = 1.0 if calib.dropout else 0.0  # per sub-block output dropout mask (1 B)
    sib = saved_input_bytes(training, calib, ab)  # a linear's saved input (fp8: its fp8 copy)
    replicated = T_rep * D * parts * (ab + sib + drop_masks)  # per sub-block: norm input, linear input
    if calib.sp_saves_gathered_inputs:  # DTensor's SP keeps each linear's gathered input (T, not T/t)
        replicated = replicated + (T - T_rep) * D * parts * sib
    # GELU in + out, or gate, up, product; the last is fc2's input
    mlp_kept = ((2.0 if model.gated_mlp else 1.0) * ab + sib) * mlp_width
    moe_routed = 0.0 * T  # the MoE block's tensors beyond its experts' inner ones
    if moe and model.moe_latent_size:  # latent input of the experts and latent output, per token
        moe_routed = moe_routed + T * ab * 2.0 * model.moe_latent_size
    if moe:  # routed copies: k per token, each as wide as the experts' input (Calibration field)
        routed_width = model.moe_latent_size or D
        # Tokens this rank routes: under SP its T/t shard, gathered over the expert-TP group
        # (Megatron-Core MoE parallel folding: etp 1 dispatches each rank's own shard).
        routed_tokens = np.minimum(T_rep * e_t, T)
        # The experts' first linear keeps its input as any linear does (fp8: the fp8 copy TE saves,
        # saved_input_bytes); the combine keeps the experts' output in 16 bits.
        copies = calib.moe_routed_copies_kept
        routed_bytes = min(copies, 1.0) * sib + max(copies - 1.0, 0.0) * ab
        moe_routed = moe_routed + routed_tokens * model.moe_top_k * routed_width * routed_bytes
    parallel = mix.kept_bytes + T * mlp_kept / t + moe_routed
    act_none = replicated + parallel + mix.score_bytes
    # selective: Megatron's keeps all but the scores; an op-level policy far less (cost/op_recompute.py)
    act_sel = replicated + parallel if op_sel is None else op_sel.kept_bytes
    codes = plans.recompute_modules if module_codes is None else np.asarray(module_codes)[None, :]
    if op_sel is None and np.any(codes):  # Megatron's --recompute-modules
        terms = module_terms(model, kind, calib, mix=mix, T=T, T_rep=T_rep, t=t, ab=ab, sib=sib, hbm=hbm,
                              peak=peak, linear_time=linear_time, t_mlp=t_mlp, t_attn=t_attn,
                              per_channel=(2.0 if model.gated_mlp else 1.0) * ab + sib, moe_routed=moe_routed,
                              sub_block_tp_s=tp_exp / parts, ep_s=ep_exp)
        act_sel, rec_sel = (selective(codes, terms, act_none) if module_codes is None
                            else selective_columns(module_codes, terms, act_none))
    if module_codes is not None:  # (op-level or the core alone: the same value in every column)
        act_sel, rec_sel = (np.broadcast_to(np.asarray(v)[..., None] if np.ndim(v) < 2 else v,
                                            (len(plans), codes.size)) for v in (act_sel, rec_sel))
    act_full = T_rep * D * ab
    return LayerCost(
        fwd_compute_s=fwd_compute, bwd_compute_s=bwd_compute,
        fwd_comm_exposed_s=fwd_comm_exposed, bwd_comm_exposed_s=bwd_comm_exposed,
        fwd_comm_total_s=fwd_comm_total, bwd_comm_total_s=tp_bwd.total_s + cp_bwd + ep_fwd + framework * (2.0 / 3.0),
        recompute_selective_s=rec_sel, recompute_full_s=rec_full,
        params_per_gpu=dense_g + expert_g, dense_params_per_gpu=dense_g + 0 * T,
        state_bytes=states, act_none_bytes=act_none, act_selective_bytes=act_sel,
        act_full_bytes=act_full, tp_exposed_s=tp_exp + tp_exp_bwd, cp_exposed_s=cp_exp + cp_exp_bwd,
        ep_exposed_s=ep_exp + ep_exp_bwd,
    )
