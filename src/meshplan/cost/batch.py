"""Vectorised cost model: many plans at once with NumPy (the search evaluates 1e5-1e7 plans/s).

Public API (stable; the search helper codes against it):

* :class:`~meshplan.cost.arrays.PlanArrays` -- plans as a struct of arrays
  (``PlanArrays.from_plans(list_of_plans)``, ``.plan(i)``, ``.take(mask)``).
* :func:`~meshplan.cost.layer.layer_cost` -- ONE transformer layer for one micro-batch on one GPU:
  forward/backward time, recompute extras (selective, full), per-layer states
  (weights+grads+optimizer after ZeRO) and activations under none/selective/full recompute.
* :func:`rank_cost` -- one pipeline rank holding ``layers`` layers (``recomputed`` of them under the
  plan's policy), with the embedding and/or LM head when asked: per-micro-batch time, step-level
  DP communication and optimizer time, and memory by category. A layer-split search calls it
  with its own per-rank layer counts; ``rank_cost(..., layers=0, has_head=True)`` is the extra of
  the LM-head stage alone (and ``has_embedding=True`` of the embedding stage), fixed per-GPU
  overheads (framework, buffers) included.
* :func:`~meshplan.cost.pipeline.pipeline_time` and :func:`~meshplan.cost.pipeline.in_flight_chunks`
  -- schedule composition (bubble, activations in flight per rank).
* :func:`estimate_batch` -- even layer split, all-layer recompute policy: step time, peak memory,
  tokens/s per GPU, MFU, fits, for every plan. ``meshplan.cost.estimate`` on one ``Plan`` gives the
  same numbers (tests/planner/test_cost_batch.py checks it).

No Python branching on plan values: every formula uses ``np.where`` so that arrays broadcast.
Plans are assumed valid (``Plan.validate_for``); the search filters before it evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.offload import host_budget_bytes, rank_offload
from meshplan.cost.osdp import extra_gather_latency_s, rank_osdp, uses_osdp
from meshplan.cost.expert_load import replica_factor
from meshplan.cost.vocab import vocab_shares, vocab_sync_s
from meshplan.cost.arrays import RC_FULL, RC_NONE, RC_SELECTIVE, ZERO_BUBBLE, PlanArrays
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.flops import model_flops_per_token
from meshplan.cost.layer import LayerCost, activation_bytes, gemm_time, layer_cost, optimizer_state_bytes_per_param
from meshplan.plan import OFFLOAD_OPTIMIZER_BIT
from meshplan.cost.pipeline import (head_microbatches_held, in_flight_chunks, pipeline_time, rank_layers_even,
                                    recv_buffers_held)
from meshplan.cost.precision import (
    compute_dtype_peak_flops,
    op_rates,
    weight_copy_bytes_per_param,
)
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class RankCost:
    """One pipeline rank, arrays over plans. Times per micro-batch unless said per step."""

    compute_s: np.ndarray
    """Forward + backward math of all the rank's chunks for one micro-batch (no recompute)."""
    recompute_s: np.ndarray
    comm_exposed_s: np.ndarray
    """TP/CP/EP, pipeline send/recv and ZeRO-3 gathers left exposed, per micro-batch."""
    comm_total_s: np.ndarray
    dp_exposed_s: np.ndarray
    """Per step: data-parallel gradient reduce (+ ZeRO-1/2 parameter gather) left exposed."""
    dp_total_s: np.ndarray
    optimizer_s: np.ndarray
    """Per step: optimizer update over this GPU's share of the states (HBM-bound)."""
    parameters_bytes: np.ndarray
    gradients_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray
    """Buffers, ZeRO-3 gathered layers, framework (CUDA context, NCCL), and the allocator's
    reserve (``reserve_bytes`` of it: kept in one sum so the search adds five arrays, not six)."""
    reserve_bytes: np.ndarray
    """What the caching allocator reserves beyond the peak allocated (fragmentation)."""
    offload_exposed_s: np.ndarray | float = 0.0
    """Per micro-batch: host-device copies of offloaded parameters and activations left exposed
    (:mod:`meshplan.cost.offload`)."""
    offload_total_s: np.ndarray | float = 0.0
    offload_step_s: np.ndarray | float = 0.0
    """Per step: the offloaded optimizer's gradient download, host (CPU Adam) step and upload."""
    host_bytes: np.ndarray | float = 0.0
    """Host memory this GPU's offloaded tensors take (not part of ``memory_bytes``)."""
    osdp_compute_s: np.ndarray | float = 0.0
    """Of ``compute_s``: OSDP's split GEMMs, their launches and the chunked LM head's recompute."""
    osdp_gather_latency_s: np.ndarray | float = 0.0
    """Of ``comm_total_s``: the latency of OSDP's extra gathers (one per extra FSDP unit)."""
    kept_weight_bytes: np.ndarray | float = 0.0
    """Of ``parameters_bytes``: OSDP's kept groups beyond their shards."""
    gathered_weight_bytes: np.ndarray | float = 0.0
    """Of ``other_bytes``: ZeRO-3's gathered layers (OSDP: sharded groups, MLP a slice at a time)."""
    logits_bytes: np.ndarray | float = 0.0
    """Of ``activations_bytes``: the logits and loss transients at once (OSDP: one chunk's)."""

    @property
    def microbatch_s(self) -> np.ndarray:
        return _plus(self.compute_s + self.recompute_s + self.comm_exposed_s, self.offload_exposed_s)

    @property
    def step_extra_s(self) -> np.ndarray:
        return _plus(self.dp_exposed_s + self.optimizer_s, self.offload_step_s)

    @property
    def memory_bytes(self) -> np.ndarray:
        """Peak reserved: allocated + the allocator's reserve; what must fit in the GPU."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_bytes)

    @property
    def allocated_bytes(self) -> np.ndarray:
        """Peak allocated (torch.cuda.max_memory_allocated plus what lies outside the allocator)."""
        return self.memory_bytes - self.reserve_bytes


def _plus(x: np.ndarray, extra: np.ndarray | float) -> np.ndarray:
    """``x + extra``, without a pass over ``x`` when ``extra`` is the scalar 0 (no offload)."""
    return x if isinstance(extra, float) and extra == 0.0 else x + extra


def num_microbatches(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    return np.maximum(training.global_batch // np.maximum(plans.dp * plans.micro_batch, 1), 1)


@dataclass(frozen=True)
class PlanTerms:
    """What :func:`rank_cost` computes from the plans alone (not the rank, its layers or its
    embedding / head): the same for every rank of a plan, so a caller scoring several ranks of the
    same plans computes it once (:func:`plan_terms`) and passes it to each call."""

    hbm: float
    head_flops: float
    """Peak rate of the LM head's GEMM (the compute dtype's: it stays bf16)."""
    linear_flops: float
    """Peak rate of the layers' linear GEMMs (fp8/fp4 where the recipe runs them so)."""
    t: np.ndarray
    v: np.ndarray
    T: np.ndarray
    rec_one: np.ndarray
    Vt: np.ndarray
    head_compute_s: np.ndarray
    embed_compute_s: np.ndarray
    p2p_s: np.ndarray
    embed_p: float
    head_p: np.ndarray
    n1: np.ndarray
    n1_e: np.ndarray
    lvl1: comms.Link
    lvl1_e: comms.Link
    """The experts' data-parallel group (n1_e ranks ep * etp apart: Megatron lays experts out
    etp, ep, edp from the innermost), which reduces the expert gradients."""
    lvl2: comms.Link
    act_policy: np.ndarray
    m: np.ndarray
    m_float: np.ndarray
    pp_float: np.ndarray
    dense_shards: tuple[np.ndarray, ...]
    """Indexed by ZeRO stage 0-3: ranks a dense state is sharded over at that stage (n1 where
    the plan's ZeRO stage reaches it, else 1)."""
    expert_shards: tuple[np.ndarray, ...]
    """The same for expert states (the experts' data-parallel degree n1 * tp / (etp * ep), at
    least 1; n1 / ep when etp = tp)."""
    vocab_sync_s: np.ndarray | float = 0.0
    """Per micro-batch: vocabulary parallelism's synchronisation over the pp ranks (cost.vocab)."""
    osdp: bool = False
    """Whether any plan keeps a group gathered or splits an operator (cost.osdp.uses_osdp)."""


def plan_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
               calib: Calibration, layer: LayerCost) -> PlanTerms:
    """The rank-independent part of :func:`rank_cost` (see :class:`PlanTerms`)."""
    peak = compute_dtype_peak_flops(cluster, training)  # the LM head stays bf16 (cost/precision.py)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency
    t = plans.tp.astype(float)
    c = plans.cp.astype(float)
    p = plans.pp
    v = plans.vpp.astype(float)
    T = plans.micro_batch * training.seq_len / c
    D, V = float(model.hidden_size), float(model.vocab_size)
    ab = activation_bytes(training.precision)  # bytes per activation element
    rec_one = np.where(plans.recompute == RC_FULL, layer.recompute_full_s,
                       np.where(plans.recompute == RC_SELECTIVE, layer.recompute_selective_s, 0.0))
    # LM head: (T x D) @ (D x V/t) forward, 2x backward; cross-entropy reads/writes the logits.
    # Per-rank vocabulary padded as Megatron does (see Calibration.vocab_pad_multiple).
    pad = max(calib.vocab_pad_multiple, 1.0)
    Vt = np.ceil(V / (t * pad)) * pad
    head_fwd = gemm_time(calib, peak, T, Vt, D) + 3.0 * T * Vt * ab / hbm
    # Pipeline p2p: (b, S/c, D)/t activation out, its gradient back, per chunk (Narayanan 2021
    # Sec. 4.1 scatter/gather splits the message over the TP ranks).
    pp_link = comms.group_link(cluster, calib, p, plans.tp * plans.cp * plans.dp_shard * plans.dp_replicate)
    p2p = 2.0 * v * comms.p2p_time(T * D * ab / t, p > 1, pp_link)
    embed_p = model.embedding_params() / t
    tied_copy = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    head_p = (model.head_params() + np.where(p > 1, tied_copy, 0)) / t
    n1 = (plans.dp_shard * plans.cp).astype(float)  # ZeRO shards over dp_shard x cp (torchtitan)
    act_policy = np.where(plans.recompute == RC_FULL, layer.act_full_bytes,
                          np.where(plans.recompute == RC_SELECTIVE, layer.act_selective_bytes,
                                   layer.act_none_bytes))
    z = plans.zero
    dense_shards = (n1,) + tuple(np.where(z >= stage, n1, 1.0) for stage in (1, 2, 3))
    if model.is_moe:
        n1_e = np.maximum(n1 * plans.tp / (plans.etp * plans.ep), 1.0)  # edp = dp_shard*cp*tp/(etp*ep)
        expert_shards = (n1_e,) + tuple(np.where(z >= stage, n1_e, 1.0) for stage in (1, 2, 3))
    else:  # etp = tp, ep = 1: edp = n1, the same shards
        n1_e, expert_shards = n1, dense_shards
    lvl1 = comms.group_link(cluster, calib, n1, plans.tp)  # (dense models: also the experts' group)
    m = num_microbatches(training, plans)
    vocab_sync = vocab_sync_s(plans.vocab_parallel, p, T, D, ab, t, pp_link) if plans.vocab_parallel.any() else 0.0
    return PlanTerms(vocab_sync_s=vocab_sync, osdp=uses_osdp(plans),
        dense_shards=dense_shards, expert_shards=expert_shards,
        hbm=hbm, head_flops=peak, linear_flops=op_rates(cluster, training, calib).linear_flops,
        t=t, v=v, T=T, rec_one=rec_one, Vt=Vt, head_compute_s=3.0 * head_fwd,
        embed_compute_s=3.0 * T * D * ab / hbm, p2p_s=p2p,  # embedding lookup + grad
        embed_p=embed_p, head_p=head_p, n1=n1, n1_e=n1_e,
        lvl1=lvl1, lvl1_e=comms.group_link(cluster, calib, n1_e, plans.ep * plans.etp) if model.is_moe else lvl1,
        lvl2=comms.group_link(cluster, calib, plans.dp_replicate, plans.tp * plans.cp * plans.dp_shard),
        act_policy=act_policy, m=m, m_float=m.astype(float), pp_float=p.astype(float))


def rank_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              calib: Calibration, layer: LayerCost, *, rank, layers, recomputed,
              has_embedding, has_head, terms: PlanTerms | None = None, totals: bool = True,
              offloaded_layers=None, has_mtp=None) -> RankCost:
    """Cost of pipeline rank ``rank`` holding ``layers`` layers, ``recomputed`` of them under the
    plan's recompute policy (arrays or scalars; booleans for the embedding / LM head), and
    ``offloaded_layers`` of them with their activations in host memory when the plan offloads
    activations (None: all, ``meshplan.cost.offload``).
    ``terms`` is ``plan_terms(...)`` of the same arguments when the caller has it. ``totals``
    False leaves ``comm_total_s`` NaN: a figure for breakdowns that :func:`compose` does not
    read, skipped where the search scores millions of ranks."""
    if terms is None:
        terms = plan_terms(model, cluster, training, plans, calib, layer)
    hbm, v, T, Vt = terms.hbm, terms.v, terms.T, terms.Vt
    p = plans.pp
    m = terms.m
    # Multi-token-prediction modules (DeepSeek-V3 Sec. 2.2) run after the stack on the last rank,
    # as Megatron places them by default, or where the plan's layout puts them (``has_mtp``, None:
    # with the head): each is charged as one more average layer plus one more LM-head pass.
    mtp = float(model.mtp_num_layers)
    has_mtp = has_head if has_mtp is None else has_mtp
    layers = np.asarray(layers, dtype=float)
    if mtp:
        layers = layers + np.where(has_mtp, mtp, 0.0)
    recomputed = np.where(plans.recompute == RC_NONE, 0.0, np.asarray(recomputed, dtype=float))

    # ---- time per micro-batch ------------------------------------------------------------
    rec_one = terms.rec_one
    compute = layers * (layer.fwd_compute_s + layer.bwd_compute_s)
    comm_exp = layers * (layer.fwd_comm_exposed_s + layer.bwd_comm_exposed_s)
    comm_tot = layers * (layer.fwd_comm_total_s + layer.bwd_comm_total_s) if totals else np.nan
    # The embedding and the head sit on the first and last rank, or 1/pp of each on every rank
    # with vocabulary parallelism (cost.vocab); the MTP modules' head passes stay on the last.
    embed_share, head_share = vocab_shares(plans.vocab_parallel, p, has_embedding, has_head)
    head_passes = head_share + np.where(has_mtp, mtp, 0.0) if mtp else head_share
    compute = compute + head_passes * terms.head_compute_s
    compute = compute + embed_share * terms.embed_compute_s
    compute = compute + calib.microbatch_overhead_s  # host work per micro-batch (Calibration)
    # the vocabulary-parallel sync runs blocking between the passes (cost.vocab): never overlapped
    comm_exp = comm_exp + terms.p2p_s * (1.0 - calib.pp_p2p_overlap) + terms.vocab_sync_s
    if totals:
        comm_tot = comm_tot + terms.p2p_s + terms.vocab_sync_s

    # ---- parameters on this GPU (before ZeRO) ----------------------------------------------
    # a tied head needs no copy of the embedding when both rows sit on the same rank
    head_p = (np.where(plans.vocab_parallel, model.head_params() / terms.t, terms.head_p)
              if plans.vocab_parallel.any() else terms.head_p)
    dense_p = layers * layer.dense_params_per_gpu + embed_share * terms.embed_p + head_share * head_p
    expert_p = layers * (layer.params_per_gpu - layer.dense_params_per_gpu)
    total_p = dense_p + expert_p
    n1 = terms.n1
    z = plans.zero
    opt_pp = optimizer_state_bytes_per_param(calib, training)

    experts_on = model.is_moe  # dense models hold no expert parameters: their expert terms are 0

    def shard(dense_bytes, expert_bytes, stage):
        if not experts_on:
            return dense_bytes / terms.dense_shards[stage]
        return dense_bytes / terms.dense_shards[stage] + expert_bytes / terms.expert_shards[stage]

    # OSDP (cost.osdp): groups kept gathered under zero 3, the MLP and the LM head in slices
    rest_p = np.maximum(total_p - layers * layer.params_per_gpu, 0.0)  # embedding / LM head shares
    osdp = rank_osdp(model, plans, calib, layer_params=layer.params_per_gpu,
                     dense_layer_params=layer.dense_params_per_gpu, layers=layers, rest_params=rest_p,
                     embed_params=embed_share * terms.embed_p, head_params=head_share * head_p,
                     head_share=head_share, tokens=T, vocab_per_gpu=Vt, linear_flops=terms.linear_flops,
                     head_flops=terms.head_flops, hbm_bytes_per_s=hbm,
                     activation_bytes=activation_bytes(training.precision), active=terms.osdp)
    weights = shard(dense_p * calib.weight_bytes_per_param, expert_p * calib.weight_bytes_per_param, 3)
    weights = weights + osdp.kept_weight_bytes
    # fp8/fp4 copies of the layers' linear weights (cost/precision.py; not embedding / LM head)
    copy_b = weight_copy_bytes_per_param(training, calib)
    if copy_b:
        weights = weights + shard(layers * layer.dense_params_per_gpu * copy_b, expert_p * copy_b, 3)
    gb = calib.grad_bytes_per_param(training.precision)
    grads = shard(dense_p * gb, expert_p * gb, 2)
    # FSDP + PP as torch's PipelineStage runs it (torchtitan; meshplan's runtime under the
    # zero-bubble split backward): gradients accumulate unsharded in the reduce dtype over the
    # micro-batches and are reduce-scattered once, the stage's weights stay gathered.
    fsdp_pp = (z >= 3) & (p > 1)
    torch_stage = fsdp_pp & (plans.schedule == ZERO_BUBBLE) & calib.zero_bubble_keeps_unsharded
    if calib.fsdp_pp_accumulates_unsharded_grads or calib.zero_bubble_keeps_unsharded:
        grads = np.where((fsdp_pp & calib.fsdp_pp_accumulates_unsharded_grads) | torch_stage,
                         total_p * gb, grads)
    optim = shard(dense_p * opt_pp, expert_p * opt_pp, 1)

    # ---- data-parallel communication (Rajbhandari et al. 2020; Zhao et al. 2023) -------------
    lvl1, lvl2 = terms.lvl1, terms.lvl2
    g_bytes = total_p * gb  # gradients are reduced in their buffer's dtype

    def dp_ring(op, dense_bytes, expert_bytes):
        """A data-parallel collective of dense parameters over the dp group and of expert
        parameters over the expert-dp group (its own ranks, its own link)."""
        if not experts_on:  # no expert bytes: the expert group's term is 0 everywhere
            return op(dense_bytes, n1, lvl1)
        return op(dense_bytes, n1, lvl1) + np.where(
            expert_bytes > 0, op(expert_bytes, terms.n1_e, terms.lvl1_e), 0.0)

    # ZeRO-0: all-reduce grads; ZeRO-1/2: reduce-scatter grads, all-gather updated weights;
    # ZeRO-3: per micro-batch all-gather weights (fwd and bwd) and reduce-scatter grads.
    wb = calib.weight_bytes_per_param
    rs_grads = dp_ring(comms.reduce_scatter_time, dense_p * gb, expert_p * gb)
    ag_weights = dp_ring(comms.all_gather_time, dense_p * wb, expert_p * wb)
    step_lvl1 = np.where(z == 0, dp_ring(comms.all_reduce_time, dense_p * gb, expert_p * gb),
                         np.where(z <= 2, rs_grads + ag_weights, 0.0))
    # OSDP's kept groups (zero 3): their updated weights all-gathered once per step, as ZeRO-2
    if osdp.active:
        step_lvl1 = step_lvl1 + comms.all_gather_time(osdp.kept_params * calib.weight_bytes_per_param, n1, lvl1)
    step_lvl2 = comms.all_reduce_time(g_bytes / terms.dense_shards[1], plans.dp_replicate, lvl2)
    dp_total = step_lvl1 + step_lvl2
    if model.is_moe:  # hot-expert replicas: gradients all-reduced among the copies (cost/expert_load.py)
        replica_share = 1.0 - 1.0 / replica_factor(model.moe_num_experts, plans.ep, plans.expert_replicas)
        ep_link = comms.group_link(cluster, calib, plans.ep, plans.etp)
        dp_total = dp_total + np.where(plans.expert_replicas > 0, comms.all_reduce_time(
            expert_p * replica_share * gb, plans.ep, ep_link), 0.0)
    mb_bwd = layers * (layer.bwd_compute_s + layer.bwd_comm_exposed_s)
    dp_exposed = comms.exposed(dp_total, calib.dp_overlap, mb_bwd)
    if calib.dp_layer_overhead_s:  # the runtime's per-layer gradient reduction, once per step
        dp_ranks = plans.dp_replicate * n1
        dp_exposed = dp_exposed + np.where(z <= 1, layers * (dp_ranks - 1) * calib.dp_layer_overhead_s, 0.0)
    # ZeRO-3 (FSDP) all-gathers each layer's parameters (forward and backward) and
    # reduce-scatters its gradients every micro-batch, each collective behind that layer's own
    # compute (prefetch, Zhao et al. 2023 Sec. 3.3); the embedding / LM head's behind theirs.
    # Per layer, so that a rank's time stays affine in its layer count (search/stages.py).
    # ZeRO-2 keeps only a shard of the gradients, so gradient accumulation cannot sum them
    # locally: every micro-batch's backward reduce-scatters its gradients (Rajbhandari et al.
    # 2020, Sec. 5.2; DeepSpeed stage 2, FSDP2 with reshard_after_forward=False). The last of
    # the m is the step's own (in dp_total); the other m - 1 are per micro-batch, hidden behind
    # the backward like FSDP's. Averaged over the m micro-batches: (m - 1) / m of one.
    layer_p = layer.params_per_gpu
    expert_layer_p = layer.params_per_gpu - layer.dense_params_per_gpu
    layer_compute = layer.fwd_compute_s + layer.bwd_compute_s
    rest_compute = np.maximum(compute - layers * layer_compute, 0.0)
    if osdp.active:
        compute = compute + osdp.compute_s

    def fsdp_time(gathered, experts, reduce_scatter_s):
        """FSDP's two gathers and one reduce-scatter (``reduce_scatter_s``); ``experts`` of the
        gathered params are expert ones (always sharded: OSDP keeps dense groups only)."""
        dense_gathered = np.maximum(gathered - experts, 0.0) if experts_on else gathered
        gather = dp_ring(comms.all_gather_time, dense_gathered * wb, experts * wb)
        return 2 * gather + reduce_scatter_s

    extra_latency = 0.0
    # Each stage's terms only where some plan runs it (np.where picks them nowhere else).
    zero3, zero2 = bool(np.any(z >= 3)), bool(np.any(z == 2))
    z3_exp = z3_tot = z2_exp = z2_tot = 0.0
    if zero3 or zero2:
        # The gradients' reduce-scatter of the embedding / LM head shares, and of a layer when it
        # holds no experts: ZeRO-3's (with the two gathers) and ZeRO-2's (per micro-batch) are
        # the same collective.
        has_rest = rest_p > 0
        rs_rest = comms.reduce_scatter_time(rest_p * gb, n1, lvl1)
        if not experts_on:
            rs_layer3 = rs_layer2 = comms.reduce_scatter_time(layer_p * gb, n1, lvl1)
    if zero3:
        if experts_on:
            rs_layer3 = dp_ring(comms.reduce_scatter_time, (layer_p - expert_layer_p) * gb, expert_layer_p * gb)
        # OSDP: only the sharded groups are re-gathered; each extra unit (MLP slice) one more latency
        z3_layer = fsdp_time(osdp.sharded_layer_params, expert_layer_p, rs_layer3)
        if osdp.active:
            extra_latency = np.where(z >= 3, 2 * extra_gather_latency_s(osdp.extra_gathers, n1, lvl1), 0.0)
            z3_layer = z3_layer + extra_latency
        z3_rest = np.where(has_rest, fsdp_time(osdp.sharded_rest_params, 0.0, rs_rest), 0.0)
        z3_exp = (layers * comms.exposed(z3_layer, calib.fsdp_overlap, layer_compute)
                  + comms.exposed(z3_rest, calib.fsdp_overlap, rest_compute))
        z3_tot = layers * z3_layer + z3_rest if totals else 0.0
    if zero2:
        if experts_on:
            rs_layer2 = dp_ring(comms.reduce_scatter_time, layer.dense_params_per_gpu * gb, expert_layer_p * gb)
        accumulate = (terms.m_float - 1.0) / terms.m_float
        z2_layer = rs_layer2 * accumulate
        z2_rest = np.where(has_rest, rs_rest, 0.0) * accumulate
        z2_exp = (layers * comms.exposed(z2_layer, calib.fsdp_overlap, layer.bwd_compute_s)
                  + comms.exposed(z2_rest, calib.fsdp_overlap, rest_compute))
        z2_tot = layers * z2_layer + z2_rest if totals else 0.0
    comm_exp = comm_exp + np.where(z >= 3, z3_exp, np.where(z == 2, z2_exp, 0.0))
    if totals:
        comm_tot = comm_tot + np.where(z >= 3, z3_tot, np.where(z == 2, z2_tot, 0.0))

    # ---- optimizer step: read grads, master, moments; write master, moments, weights -------
    opt_bytes = shard(dense_p, expert_p, 1) * (2 * opt_pp + gb + wb)
    optimizer_s = opt_bytes / hbm

    # ---- activations ------------------------------------------------------------------------
    act_policy = terms.act_policy
    per_mb = recomputed * act_policy + (layers - recomputed) * layer.act_none_bytes
    held = in_flight_chunks(rank, terms.pp_float, v, terms.m_float, plans.schedule,  # floats: no re-conversion
                            plans.vocab_parallel)
    acts = held * per_mb / v
    # Backward of a recomputed layer rematerialises what was dropped, one layer at a time.
    acts = acts + np.where(recomputed > 0, layer.act_none_bytes - act_policy, 0.0)
    # Kept logits for every micro-batch the head stage holds (GPipe: all m), the loss's transients once.
    head_mbs = head_microbatches_held(terms.m_float, plans.schedule)
    logits = head_share * T * Vt * osdp.logits_fraction * (calib.logits_bytes_per_element * head_mbs
                                                            + calib.loss_transient_bytes_per_element)
    acts = acts + logits

    # ---- offload to host memory (meshplan.cost.offload): what leaves the GPU, what it costs --
    offloaded = plans.offload > 0
    off = None
    if offloaded.any():  # else nothing leaves the GPU: every offload term is 0
        off = rank_offload(cluster, plans.offload, weights_bytes=weights, grads_bytes=grads, optim_bytes=optim,
                           microbatch_activations_bytes=per_mb, stored_activations_bytes=held * per_mb / v,
                           layer_activation_bytes=np.where(recomputed > 0, act_policy, layer.act_none_bytes),
                           layers=layers, params_on_gpu=total_p / terms.dense_shards[1], compute_s=compute,
                           backward_s=mb_bwd, offloaded_layers=offloaded_layers,
                           activation_overlap=calib.activation_offload_overlap)
        weights, grads = weights - off.parameters_saved_bytes, grads - off.gradients_saved_bytes
        optim, acts = optim - off.optimizer_saved_bytes, acts - off.activations_saved_bytes
        optimizer_s = np.where(plans.offload & OFFLOAD_OPTIMIZER_BIT, 0.0, optimizer_s)  # the host's now

    # ---- other: buffers, ZeRO-3 gathered layers, framework, fragmentation ------------------
    # FSDP unshards the current layer and prefetches the next: up to two layers gathered beyond
    # the shard already held (Zhao et al. 2023 Sec. 3.2). With pipelining, the whole stage stays
    # unsharded between its micro-batches (Calibration.fsdp_pp_keeps_unsharded).
    # OSDP: the sharded groups only, the MLP a slice at a time (all of them when the stage stays
    # unsharded).
    gathered, gathered_p = np.minimum(2.0, layers), osdp.gathered_layer_params
    if (calib.fsdp_pp_keeps_unsharded or calib.zero_bubble_keeps_unsharded) and np.any(z >= 3):
        keep = (fsdp_pp & calib.fsdp_pp_keeps_unsharded) | torch_stage
        gathered = np.where(keep, layers, gathered)
        if osdp.active:
            gathered_p = np.where(keep, osdp.sharded_layer_params, gathered_p)
    z3_buffers = np.where(z >= 3, gathered * gathered_p
                          * calib.weight_bytes_per_param * (1.0 - 1.0 / n1), 0.0)
    reserve = calib.allocator_fragmentation * (weights + grads + optim + acts)
    # Pipeline receive buffers, when the stack preallocates one per micro-batch (torch's pipelining):
    # the (b, S/c, D) hidden state, /t under sequence parallel (what the stages send).
    hidden_bytes = T * model.hidden_size * activation_bytes(training.precision) / np.where(plans.sp, plans.tp, 1)
    recv_buffers = np.where(calib.pp_preallocated_recv_buffers,
                            recv_buffers_held(rank, p, v, terms.m_float) * hidden_bytes, 0.0)
    other = (calib.comm_bucket_bytes + z3_buffers + recv_buffers + calib.framework_overhead_gib * 1024**3
             + reserve)
    recompute_s = recomputed * rec_one
    if np.shape(recompute_s) != np.shape(layers):
        recompute_s = layers * 0 + recompute_s  # the rank's shape
    return RankCost(
        compute_s=compute, recompute_s=recompute_s,
        comm_exposed_s=comm_exp, comm_total_s=comm_tot,
        dp_exposed_s=dp_exposed, dp_total_s=dp_total, optimizer_s=optimizer_s,
        parameters_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim,
        activations_bytes=acts, other_bytes=other, reserve_bytes=reserve,
        offload_exposed_s=0.0 if off is None else np.where(offloaded, off.microbatch_exposed_s, 0.0),
        offload_total_s=0.0 if off is None else off.microbatch_total_s,
        offload_step_s=0.0 if off is None else off.step_exposed_s, host_bytes=0.0 if off is None else off.host_bytes,
        osdp_compute_s=osdp.compute_s, osdp_gather_latency_s=layers * extra_latency,
        kept_weight_bytes=osdp.kept_weight_bytes, gathered_weight_bytes=z3_buffers, logits_bytes=logits,
    )


@dataclass(frozen=True)
class BatchEstimate:
    """Arrays over plans (even split, all-layer recompute)."""

    step_time_s: np.ndarray
    bubble_s: np.ndarray
    peak_memory_bytes: np.ndarray
    """Peak reserved (allocated + allocator reserve): what ``fits`` compares with the GPU."""
    peak_allocated_bytes: np.ndarray | None
    """Peak allocated (no allocator reserve); None when ``compose`` was not asked for it (the
    search scores on reserved alone)."""
    tokens_per_s_per_gpu: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    fits: np.ndarray
    """GPU memory fits, and the offloaded tensors fit in the GPU's share of host memory."""
    host_memory_bytes: np.ndarray | float = 0.0
    """Host memory of the GPU whose offloaded tensors take the most."""


def estimate_batch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                   plans: PlanArrays, calib: Calibration | None = None) -> BatchEstimate:
    """Every plan with an even layer split: the first and last pipeline ranks are the candidates
    for the slowest and the most loaded (they hold the extra layers, the embedding, the head and
    the most in-flight micro-batches)."""
    calib = calib or calibration_for(cluster.gpu)
    layer = layer_cost(model, cluster, training, plans, calib)
    last = plans.pp - 1
    kw = dict(model=model, cluster=cluster, training=training, plans=plans, calib=calib, layer=layer)
    kw["terms"] = plan_terms(**kw)  # shared by both ranks
    l0 = rank_layers_even(model.num_layers, 0, plans.pp, plans.vpp)
    ll = rank_layers_even(model.num_layers, last, plans.pp, plans.vpp)
    first = rank_cost(**kw, rank=0, layers=l0, recomputed=l0, has_embedding=True, has_head=plans.pp == 1)
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True)
    return compose(model, cluster, training, plans, [first, final, *middle_rank(model, plans, calib, kw)],
                   calib, allocated=True)


def middle_rank(model: ModelSpec, plans: PlanArrays, calib: Calibration, kw: dict) -> list[RankCost]:
    """Rank 1 as a third candidate for the most loaded rank where the stack preallocates a
    receive buffer per micro-batch (Calibration.pp_preallocated_recv_buffers): a middle rank holds
    both kinds (2v per micro-batch, the ends 2v - 1), which with many micro-batches outweighs the
    first rank's extra in-flight chunk and embedding. Rank 1 holds the most of the middle ranks
    (earlier ranks take the extra layers and hold more chunks in flight). None otherwise."""
    if not calib.pp_preallocated_recv_buffers:
        return []
    last = plans.pp - 1
    mid = np.minimum(1, last)
    lm = rank_layers_even(model.num_layers, mid, plans.pp, plans.vpp)
    return [rank_cost(**kw, rank=mid, layers=lm, recomputed=lm, has_embedding=plans.pp == 1,
                      has_head=mid == last)]


@dataclass(frozen=True)
class StepPeak:
    """Of :func:`compose`, what the search reads: arrays over plans."""

    step_time_s: np.ndarray
    bubble_s: np.ndarray
    peak_memory_bytes: np.ndarray
    """Peak reserved over the ranks."""
    host_memory_bytes: np.ndarray
    """Host memory of the rank whose offloaded tensors take the most."""


def _most(values: list) -> np.ndarray:
    """Elementwise max over the ranks (what ``np.max(values, axis=0)`` gives, without stacking)."""
    out = np.asarray(values[0])
    for x in values[1:]:
        out = np.maximum(out, x)
    return out


def compose_step_peak(training: TrainingSpec, plans: PlanArrays, ranks: list[RankCost],
                      calib: Calibration) -> StepPeak:
    """Step time, bubble, peak memory and host memory from the ranks' costs (max over ranks):
    the figures of :func:`compose` the search reads, without the throughput columns."""
    return compose_maxima(training, plans, calib, microbatch_s=_most([r.microbatch_s for r in ranks]),
                          step_extra_s=_most([r.step_extra_s for r in ranks]),
                          memory_bytes=_most([r.memory_bytes for r in ranks]),
                          host_bytes=_most([r.host_bytes for r in ranks]))


def compose_maxima(training: TrainingSpec, plans: PlanArrays, calib: Calibration, *, microbatch_s,
                   step_extra_s, memory_bytes, host_bytes) -> StepPeak:
    """:func:`compose_step_peak` from the maxima over the ranks of their ``RankCost`` figures
    (the slowest rank's micro-batch time, the largest step tail, the most loaded rank's memory
    and host memory), for a caller that holds the ranks stacked in one array."""
    m = num_microbatches(training, plans)
    fb, bubble = pipeline_time(microbatch_s, m, plans.pp, plans.vpp, plans.schedule, calib)
    step = fb + step_extra_s
    host = np.broadcast_to(host_bytes, np.shape(memory_bytes))
    return StepPeak(step_time_s=step, bubble_s=bubble, peak_memory_bytes=memory_bytes, host_memory_bytes=host)


def compose(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
            ranks: list[RankCost], calib: Calibration, *, allocated: bool = False) -> BatchEstimate:
    """Step time and peak memory from the ranks' costs (max over ranks); the peak allocated
    too with ``allocated``."""
    sp = compose_step_peak(training, plans, ranks, calib)
    step, bubble, peak, host = sp.step_time_s, sp.bubble_s, sp.peak_memory_bytes, sp.host_memory_bytes
    peak_allocated = _most([r.allocated_bytes for r in ranks]) if allocated else None
    gpus = plans.world_size
    tokens_per_gpu = training.tokens_per_step / step / gpus
    tflops = tokens_per_gpu * model_flops_per_token(model, training.seq_len) / 1e12
    mfu = tflops * 1e12 / cluster.gpu.peak_flops(training.precision)
    host_fits = (host == 0) | (host <= host_budget_bytes(cluster))
    return BatchEstimate(step_time_s=step, bubble_s=bubble, peak_memory_bytes=peak,
                         peak_allocated_bytes=peak_allocated,
                         tokens_per_s_per_gpu=tokens_per_gpu, tflops_per_gpu=tflops, mfu=mfu,
                         fits=(peak <= cluster.gpu.memory_bytes) & host_fits, host_memory_bytes=host)
