"""Data-parallel communication of one pipeline rank, arrays over plans: the step's gradient
reduction (+ ZeRO-1/2 parameter gather, hot-expert replicas' all-reduce) and ZeRO-3 / ZeRO-2's
per-micro-batch gathers and reduce-scatters (Rajbhandari et al. 2020; Zhao et al. 2023).

Pure functions called from :func:`meshplan.cost.batch.rank_cost`; ``np.where`` only, no Python
branching on plan values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.expert_load import replica_factor
from meshplan.cost.layer import LayerCost
from meshplan.cost.osdp import OsdpCost, extra_gather_latency_s
from meshplan.cost.plan_terms import PlanTerms
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec


def dp_ring(op, terms: PlanTerms, experts_on: bool, dense_bytes, expert_bytes):
    """A data-parallel collective ``op`` of dense parameters over the dp group and of expert
    parameters over the expert-dp group (its own ranks, its own link)."""
    if not experts_on:  # no expert bytes: the expert group's term is 0 everywhere
        return op(dense_bytes, terms.zero_ranks, terms.zero_link)
    return op(dense_bytes, terms.zero_ranks, terms.zero_link) + np.where(
        expert_bytes > 0, op(expert_bytes, terms.expert_zero_ranks, terms.expert_zero_link), 0.0)


@dataclass(frozen=True)
class StepDpComm:
    total_s: np.ndarray
    exposed_s: np.ndarray
    """Of ``total_s``, left exposed behind the last micro-batch's backward (``calib.dp_overlap``)."""


def step_dp_comm(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, calib: Calibration,
                 terms: PlanTerms, osdp: OsdpCost, *, layers, dense_params, expert_params, total_params,
                 grad_bytes_per_param: float, backward_s, experts_on: bool,
                 overlap_grad_reduce: bool = True) -> StepDpComm:
    """Per step: ZeRO-0 all-reduces the gradients; ZeRO-1/2 reduce-scatter them and all-gather the
    updated weights; ZeRO-3 does neither here (per micro-batch: :func:`zero_microbatch_comm`).
    The dp_replicate level (HSDP) all-reduces the shards; ``backward_s`` hides part of it
    (``calib.dp_overlap``). Without ``overlap_grad_reduce`` (``TrainingSpec``) the gradient
    reduction waits for the backward and is all exposed; the ZeRO-1/2 weights' all-gather keeps
    its overlap (``overlap_param_gather``, a separate setting that the presets leave on)."""
    z = plans.zero
    n1, lvl1 = terms.zero_ranks, terms.zero_link
    gb, wb = grad_bytes_per_param, calib.weight_bytes_per_param
    g_bytes = total_params * gb  # gradients are reduced in their buffer's dtype
    rs_grads = dp_ring(comms.reduce_scatter_time, terms, experts_on, dense_params * gb, expert_params * gb)
    ag_weights = dp_ring(comms.all_gather_time, terms, experts_on, dense_params * wb, expert_params * wb)
    grads_lvl1 = np.where(z == 0, dp_ring(comms.all_reduce_time, terms, experts_on, dense_params * gb,
                                          expert_params * gb), np.where(z <= 2, rs_grads, 0.0))
    params_lvl1 = np.where((z >= 1) & (z <= 2), ag_weights, 0.0)
    step_lvl1 = grads_lvl1 + params_lvl1
    # OSDP's kept groups (zero 3): their updated weights all-gathered once per step, as ZeRO-2
    if osdp.active:
        step_lvl1 = step_lvl1 + comms.all_gather_time(osdp.kept_params * wb, n1, lvl1)
    step_lvl2 = comms.all_reduce_time(g_bytes / terms.dense_shards[1], plans.dp_replicate, terms.replicate_link)
    dp_total = step_lvl1 + step_lvl2
    if model.is_moe:  # hot-expert replicas: gradients all-reduced among the copies (cost/expert_load.py)
        replica_share = 1.0 - 1.0 / replica_factor(model.moe_num_experts, plans.ep, plans.expert_replicas)
        ep_link = comms.group_link(cluster, calib, plans.ep, plans.etp)
        dp_total = dp_total + np.where(plans.expert_replicas > 0, comms.all_reduce_time(
            expert_params * replica_share * gb, plans.ep, ep_link), 0.0)
    if overlap_grad_reduce:
        dp_exposed = comms.exposed(dp_total, calib.dp_overlap, backward_s)
    else:  # the gradient reduction (and the replicas' all-reduce) after the backward, exposed
        params_s = params_lvl1 + (comms.all_gather_time(osdp.kept_params * wb, n1, lvl1) if osdp.active else 0.0)
        dp_exposed = (dp_total - params_s) + comms.exposed(params_s, calib.dp_overlap, backward_s)
    if calib.dp_layer_overhead_s:  # the runtime's per-layer gradient reduction, once per step
        dp_ranks = plans.dp_replicate * n1
        dp_exposed = dp_exposed + np.where(z <= 1, layers * (dp_ranks - 1) * calib.dp_layer_overhead_s, 0.0)
    return StepDpComm(total_s=dp_total, exposed_s=dp_exposed)


@dataclass(frozen=True)
class MicrobatchDpComm:
    exposed_s: np.ndarray | float
    """Per micro-batch, ZeRO-3's or ZeRO-2's collectives left exposed (0 for other stages)."""
    total_s: np.ndarray | float
    """All of them (0 when not asked for: ``totals`` False)."""
    extra_latency_s: np.ndarray | float
    """Per layer, of ``total_s``: OSDP's extra gathers' latency."""


def zero_microbatch_comm(plans: PlanArrays, calib: Calibration, layer: LayerCost, terms: PlanTerms,
                         osdp: OsdpCost, *, layers, rest_params, rest_compute_s, grad_bytes_per_param: float,
                         experts_on: bool, totals: bool) -> MicrobatchDpComm:
    """ZeRO-3 (FSDP) all-gathers each layer's parameters (forward and backward) and
    reduce-scatters its gradients every micro-batch, each collective behind that layer's own
    compute (prefetch, Zhao et al. 2023 Sec. 3.3); the embedding / LM head's (``rest_params``)
    behind theirs (``rest_compute_s``). Per layer, so that a rank's time stays affine in its
    layer count (search/stages.py).
    ZeRO-2 keeps only a shard of the gradients, so gradient accumulation cannot sum them
    locally: every micro-batch's backward reduce-scatters its gradients (Rajbhandari et al.
    2020, Sec. 5.2; DeepSpeed stage 2, FSDP2 with reshard_after_forward=False). The last of
    the m is the step's own (in :func:`step_dp_comm`); the other m - 1 are per micro-batch, hidden
    behind the backward like FSDP's. Averaged over the m micro-batches: (m - 1) / m of one."""
    z = plans.zero
    n1, lvl1 = terms.zero_ranks, terms.zero_link
    gb, wb = grad_bytes_per_param, calib.weight_bytes_per_param
    layer_p = layer.params_per_gpu
    expert_layer_p = layer.params_per_gpu - layer.dense_params_per_gpu
    layer_compute = layer.fwd_compute_s + layer.bwd_compute_s

    def fsdp_time(gathered, experts, reduce_scatter_s):
        """FSDP's two gathers and one reduce-scatter (``reduce_scatter_s``); ``experts`` of the
        gathered params are expert ones (always sharded: OSDP keeps dense groups only)."""
        dense_gathered = np.maximum(gathered - experts, 0.0) if experts_on else gathered
        gather = dp_ring(comms.all_gather_time, terms, experts_on, dense_gathered * wb, experts * wb)
        return 2 * gather + reduce_scatter_s

    extra_latency = 0.0
    # Each stage's terms only where some plan runs it (np.where picks them nowhere else).
    zero3, zero2 = bool(np.any(z >= 3)), bool(np.any(z == 2))
    z3_exp = z3_tot = z2_exp = z2_tot = 0.0
    if zero3 or zero2:
        # The gradients' reduce-scatter of the embedding / LM head shares, and of a layer when it
        # holds no experts: ZeRO-3's (with the two gathers) and ZeRO-2's (per micro-batch) are
        # the same collective.
        has_rest = rest_params > 0
        rs_rest = comms.reduce_scatter_time(rest_params * gb, n1, lvl1)
        if not experts_on:
            rs_layer3 = rs_layer2 = comms.reduce_scatter_time(layer_p * gb, n1, lvl1)
    if zero3:
        if experts_on:
            rs_layer3 = dp_ring(comms.reduce_scatter_time, terms, experts_on, (layer_p - expert_layer_p) * gb,
                                expert_layer_p * gb)
        # OSDP: only the sharded groups are re-gathered; each extra unit (MLP slice) one more latency
        z3_layer = fsdp_time(osdp.sharded_layer_params, expert_layer_p, rs_layer3)
        if osdp.active:
            extra_latency = np.where(z >= 3, 2 * extra_gather_latency_s(osdp.extra_gathers, n1, lvl1), 0.0)
            z3_layer = z3_layer + extra_latency
        z3_rest = np.where(has_rest, fsdp_time(osdp.sharded_rest_params, 0.0, rs_rest), 0.0)
        z3_exp = (layers * comms.exposed(z3_layer, calib.fsdp_overlap, layer_compute)
                  + comms.exposed(z3_rest, calib.fsdp_overlap, rest_compute_s))
        z3_tot = layers * z3_layer + z3_rest if totals else 0.0
    if zero2:
        if experts_on:
            rs_layer2 = dp_ring(comms.reduce_scatter_time, terms, experts_on, layer.dense_params_per_gpu * gb,
                                expert_layer_p * gb)
        accumulate = (terms.m_float - 1.0) / terms.m_float
        z2_layer = rs_layer2 * accumulate
        z2_rest = np.where(has_rest, rs_rest, 0.0) * accumulate
        z2_exp = (layers * comms.exposed(z2_layer, calib.fsdp_overlap, layer.bwd_compute_s)
                  + comms.exposed(z2_rest, calib.fsdp_overlap, rest_compute_s))
        z2_tot = layers * z2_layer + z2_rest if totals else 0.0
    return MicrobatchDpComm(
        exposed_s=np.where(z >= 3, z3_exp, np.where(z == 2, z2_exp, 0.0)),
        total_s=np.where(z >= 3, z3_tot, np.where(z == 2, z2_tot, 0.0)) if totals else 0.0,
        extra_latency_s=extra_latency)
