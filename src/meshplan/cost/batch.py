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
* :func:`~meshplan.cost.plan_terms.plan_terms` -- what ``rank_cost`` computes from the plans
  alone (links, ZeRO shards, head and embedding time), computed once per plan for all its ranks.
  ``rank_cost`` composes the time per micro-batch itself and calls :mod:`meshplan.cost.memory`
  (states after ZeRO, activations held, buffers and reserve) and :mod:`meshplan.cost.dp_comm`
  (the step's data-parallel reduction, ZeRO-3/2's per-micro-batch collectives).
* :func:`~meshplan.cost.pipeline.pipeline_time` and :func:`~meshplan.cost.pipeline.in_flight_chunks`
  -- schedule composition (bubble, activations in flight per rank).
* :class:`~meshplan.cost.step_compose.RankCost` and :func:`~meshplan.cost.step_compose.compose`
  -- what ``rank_cost`` returns, and the ranks composed into a step (max over ranks, throughput, fits).
* :func:`estimate_batch` -- even layer split, all-layer recompute policy: step time, peak memory,
  tokens/s per GPU, MFU, fits, for every plan. ``meshplan.cost.estimate`` on one ``Plan`` gives the
  same numbers (tests/planner/test_cost_batch.py checks it).

No Python branching on plan values: every formula uses ``np.where`` so that arrays broadcast.
Plans are assumed valid (``Plan.validate_for``); the search filters before it evaluates.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.arrays import RC_NONE, PlanArrays
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.cp_ring_memory import eager_ring_transient_bytes, torch_ring_transient_bytes
from meshplan.cost.dp_comm import step_dp_comm, zero_microbatch_comm
from meshplan.cost.layer import LayerCost, activation_bytes, layer_cost, optimizer_state_bytes_per_param
from meshplan.cost.memory import rank_activations, rank_other, rank_states, sharded_bytes, unsharded_stage
from meshplan.cost.offload import rank_offload
from meshplan.cost.osdp import rank_osdp
from meshplan.cost.pipeline import rank_layers_even
from meshplan.cost.plan_terms import PlanTerms, layer_policy, num_microbatches, plan_terms  # noqa: F401
from meshplan.cost.rank_layers import StackLayers, lead_on_rank_even, needs_rank_mix, rank_layer, stack_layers
# RankCost and the composition of the ranks into a step live in cost/step_compose.py; StepPeak,
# compose_step_peak, compose_maxima (and num_microbatches above) are imported here for the callers
# that take them from batch
from meshplan.cost.step_compose import (BatchEstimate, RankCost, StepPeak, compose,  # noqa: F401
                                        compose_maxima, compose_step_peak)
from meshplan.cost.step_memory import copies_gradients, step_excess_bytes
from meshplan.cost.vocab import vocab_shares
from meshplan.plan import OFFLOAD_OPTIMIZER_BIT
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def rank_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              calib: Calibration, layer: LayerCost, *, rank, layers, recomputed,
              has_embedding, has_head, terms: PlanTerms | None = None, totals: bool = True,
              offloaded_layers=None, has_mtp=None, chunk_weight=1.0, stack: StackLayers | None = None,
              lead=0, chunk_layers=None) -> RankCost:
    """Cost of pipeline rank ``rank`` holding ``layers`` layers, ``recomputed`` of them under the
    plan's recompute policy (arrays or scalars; booleans for the embedding / LM head), and
    ``offloaded_layers`` of them with their activations in host memory when the plan offloads
    activations (None: all, ``meshplan.cost.offload``); ``chunk_weight`` the interleaved
    schedule's weight of the rank's unequal chunks (cost/chunk_inflight.py, 1: equal),
    ``chunk_layers`` the layers of its largest chunk (None: as the even split has them).
    ``terms`` is ``plan_terms(...)`` of the same arguments when the caller has it. ``totals``
    False leaves ``comm_total_s`` NaN: a figure for breakdowns that :func:`compose` does not
    read, skipped where the search scores millions of ranks. ``stack`` (cost/rank_layers.py): charge
    the rank the kinds it holds, ``lead`` leading dense layers and its MTP modules, instead of
    ``layer``, the stack's average."""
    if terms is None:
        terms = plan_terms(model, cluster, training, plans, calib, layer)
    hbm, T, Vt = terms.hbm_bytes_per_s, terms.tokens_per_microbatch, terms.vocab_per_tp_rank
    p = plans.pp
    # Multi-token-prediction modules (DeepSeek-V3 Sec. 2.2) run after the stack on the last rank,
    # as Megatron places them by default, or where the plan's layout puts them (``has_mtp``, None:
    # with the head): each is charged as one more average layer plus one more LM-head pass.
    mtp = float(model.mtp_num_layers)
    has_mtp = has_head if has_mtp is None else has_mtp
    layers = np.asarray(layers, dtype=float)
    if stack is not None:  # the rank's own mix of kinds (cost/rank_layers.py)
        layer = rank_layer(stack, layers=layers, lead=lead, mtp=np.where(has_mtp, mtp, 0.0))
        rec_one, act_policy = layer_policy(plans, layer)
        terms = replace(terms, recompute_s_per_layer=rec_one, act_policy=act_policy)
    if mtp:
        layers = layers + np.where(has_mtp, mtp, 0.0)
        if chunk_layers is not None:  # counted with the rank's last chunk, the largest at most
            chunk_layers = np.asarray(chunk_layers, dtype=float) + np.where(has_mtp, mtp, 0.0)
    recomputed = np.where(plans.recompute == RC_NONE, 0.0, np.asarray(recomputed, dtype=float))

    # ---- time per micro-batch ------------------------------------------------------------
    rec_one = terms.recompute_s_per_layer
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
    head_p = (np.where(plans.vocab_parallel, model.head_params() / terms.t, terms.head_params)
              if plans.vocab_parallel.any() else terms.head_params)
    dense_p = layers * layer.dense_params_per_gpu + embed_share * terms.embed_params + head_share * head_p
    if mtp:  # Megatron-Core builds the embedding and output layer on the MTP stage too (GPTModel:
        # pre_process/post_process or mtp_process); copies where that rank lacks its own
        copies = (np.where(has_mtp & ~np.asarray(has_embedding, dtype=bool), terms.embed_params, 0.0)
                  + np.where(has_mtp & ~np.asarray(has_head, dtype=bool), head_p, 0.0))
        dense_p = dense_p + np.where(plans.vocab_parallel, 0.0, copies)
    expert_p = layers * (layer.params_per_gpu - layer.dense_params_per_gpu)
    total_p = dense_p + expert_p
    experts_on = model.is_moe  # dense models hold no expert parameters: their expert terms are 0
    gb = calib.grad_bytes_per_param(training.precision)

    # OSDP (cost.osdp): groups kept gathered under zero 3, the MLP and the LM head in slices
    rest_p = np.maximum(total_p - layers * layer.params_per_gpu, 0.0)  # embedding / LM head shares
    osdp = rank_osdp(model, plans, calib, layer_params=layer.params_per_gpu,
                     dense_layer_params=layer.dense_params_per_gpu, layers=layers, rest_params=rest_p,
                     embed_params=embed_share * terms.embed_params, head_params=head_share * head_p,
                     head_share=head_share, tokens=T, vocab_per_gpu=Vt, linear_flops=terms.linear_flops_per_s,
                     head_flops=terms.head_flops_per_s, hbm_bytes_per_s=hbm,
                     activation_bytes=activation_bytes(training.precision), active=terms.osdp)
    stage = unsharded_stage(plans, calib)
    states = rank_states(training, calib, layer, terms, stage, layers=layers, dense_params=dense_p,
                         expert_params=expert_p, total_params=total_p, kept_weight_bytes=osdp.kept_weight_bytes,
                         experts_on=experts_on, gpu=cluster.gpu, chunk_layers=chunk_layers)
    weights, grads, optim = states.weights_bytes, states.grads_bytes, states.optim_bytes

    # ---- data-parallel communication (cost.dp_comm) -----------------------------------------
    mb_bwd = layers * (layer.bwd_compute_s + layer.bwd_comm_exposed_s)
    dp = step_dp_comm(model, cluster, plans, calib, terms, osdp, layers=layers, dense_params=dense_p,
                      expert_params=expert_p, total_params=total_p, grad_bytes_per_param=gb,
                      backward_s=mb_bwd, experts_on=experts_on,
                      overlap_grad_reduce=training.overlap_grad_reduce)
    rest_compute = np.maximum(compute - layers * (layer.fwd_compute_s + layer.bwd_compute_s), 0.0)
    if osdp.active:
        compute = compute + osdp.compute_s
    zero = zero_microbatch_comm(plans, calib, layer, terms, osdp, layers=layers, rest_params=rest_p,
                                rest_compute_s=rest_compute, grad_bytes_per_param=gb,
                                experts_on=experts_on, totals=totals)
    comm_exp = comm_exp + zero.exposed_s
    if totals:
        comm_tot = comm_tot + zero.total_s

    # ---- optimizer step: read grads, master, moments; write master, moments, weights -------
    # (where the parameter is the master, Calibration.params_are_master: read and write it, fp32)
    param_rw = 2.0 * calib.master_bytes_per_param if calib.params_are_master else calib.weight_bytes_per_param
    opt_bytes = sharded_bytes(terms, experts_on, dense_p, expert_p, 1) * (
        2 * optimizer_state_bytes_per_param(calib, training) + gb + param_rw)
    optimizer_s = opt_bytes / hbm

    # ---- activations (cost.memory) ------------------------------------------------------------
    # One attention layer's backward transient: torch's ring (torchtitan) or meshplan's eager ring
    # (each 0 where the stack does not run it).
    attention_transient = (torch_ring_transient_bytes(model, calib, plans, tokens_per_microbatch=T, tp=terms.t,
                                                      activation_bytes=activation_bytes(training.precision))
                           + eager_ring_transient_bytes(model, calib, plans, tokens_per_microbatch=T,
                                                        seq_len=training.seq_len, tp=terms.t,
                                                        activation_bytes=activation_bytes(training.precision)))
    held = rank_activations(plans, calib, layer, terms, rank=rank, layers=layers, recomputed=recomputed,
                            head_share=head_share, logits_fraction=osdp.logits_fraction,
                            hidden_bytes_per_token=model.hidden_size * activation_bytes(training.precision),
                            chunk_weight=chunk_weight, attention_transient_bytes=attention_transient)
    acts = held.activations_bytes

    # ---- offload to host memory (meshplan.cost.offload): what leaves the GPU, what it costs --
    offloaded = plans.offload > 0
    off = None
    if offloaded.any():  # else nothing leaves the GPU: every offload term is 0
        if offloaded_layers is None and plans.offload_layers.any():  # the arrays count them (0: every layer)
            offloaded_layers = np.where(plans.offload_layers > 0, np.minimum(plans.offload_layers, layers), layers)
        off = rank_offload(cluster, plans.offload, weights_bytes=weights, grads_bytes=grads, optim_bytes=optim,
                           microbatch_activations_bytes=held.microbatch_bytes,
                           stored_activations_bytes=held.stored_bytes,
                           layer_activation_bytes=np.where(recomputed > 0, terms.act_policy, layer.act_none_bytes),
                           layers=layers, params_on_gpu=total_p / terms.dense_shards[1], compute_s=compute,
                           backward_s=mb_bwd, offloaded_layers=offloaded_layers,
                           forward_s=layers * (layer.fwd_compute_s + layer.fwd_comm_exposed_s),
                           activation_overlap=calib.activation_offload_overlap)
        weights, grads = weights - off.parameters_saved_bytes, grads - off.gradients_saved_bytes
        optim, acts = optim - off.optimizer_saved_bytes, acts - off.activations_saved_bytes
        optimizer_s = np.where(plans.offload & OFFLOAD_OPTIMIZER_BIT, 0.0, optimizer_s)  # the host's now

    # the optimizer step's gradient copies, where its peak tops the backward's (cost/step_memory.py)
    step_excess = 0.0
    if copies_gradients(training, calib):
        step_excess = step_excess_bytes(training, calib, plans.zero, rank_params=total_p,
                                        partition_params=sharded_bytes(terms, experts_on, dense_p, expert_p, 1),
                                        grads_bytes=grads, grad_bytes_per_param=gb, activations_bytes=acts)
    # ---- other: buffers, ZeRO-3 gathered layers, framework, fragmentation (cost.memory) -----
    rest = rank_other(model, training, plans, calib, terms, stage, osdp, rank=rank, layers=layers,
                      allocated_bytes=weights + grads + optim + acts, step_excess_bytes=step_excess,
                      gpu=cluster.gpu, rest_params=rest_p,
                      head_weight_params=head_share * terms.vocab_per_tp_rank * model.hidden_size,
                      logits_bytes=held.logits_bytes, attention_transient_bytes=attention_transient)
    recompute_s = recomputed * rec_one
    if np.shape(recompute_s) != np.shape(layers):
        recompute_s = layers * 0 + recompute_s  # the rank's shape
    return RankCost(
        compute_s=compute, recompute_s=recompute_s,
        comm_exposed_s=comm_exp, comm_total_s=comm_tot,
        dp_exposed_s=dp.exposed_s, dp_total_s=dp.total_s, optimizer_s=optimizer_s,
        parameters_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim,
        activations_bytes=acts, other_bytes=rest.other_bytes, reserve_bytes=rest.reserve_bytes,
        offload_exposed_s=0.0 if off is None else np.where(offloaded, off.microbatch_exposed_s, 0.0),
        offload_total_s=0.0 if off is None else off.microbatch_total_s,
        offload_step_s=0.0 if off is None else off.step_exposed_s, host_bytes=0.0 if off is None else off.host_bytes,
        osdp_compute_s=osdp.compute_s, osdp_gather_latency_s=layers * zero.extra_latency_s,
        kept_weight_bytes=osdp.kept_weight_bytes, gathered_weight_bytes=rest.gathered_weight_bytes,
        logits_bytes=held.logits_bytes, step_excess_bytes=step_excess,
    )


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
    if needs_rank_mix(model):  # each rank charged the kinds it holds (cost/rank_layers.py)
        kw["stack"] = stack_layers(model, cluster, training, plans, calib)
    l0 = rank_layers_even(model.num_layers, 0, plans.pp, plans.vpp)
    ll = rank_layers_even(model.num_layers, last, plans.pp, plans.vpp)
    first = rank_cost(**kw, rank=0, layers=l0, recomputed=l0, has_embedding=True, has_head=plans.pp == 1,
                      **even_lead(model, kw, 0, plans))
    final = rank_cost(**kw, rank=last, layers=ll, recomputed=ll, has_embedding=plans.pp == 1, has_head=True,
                      **even_lead(model, kw, last, plans))
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
                      has_head=mid == last, **even_lead(model, kw, mid, plans))]


def even_lead(model: ModelSpec, kw: dict, rank, plans: PlanArrays) -> dict:
    """``lead=`` for a rank of the even split when ``kw`` charges ranks their own kinds."""
    return {"lead": lead_on_rank_even(model, rank, plans.pp, plans.vpp)} if kw.get("stack") is not None else {}
