"""Memory of one pipeline rank, arrays over plans: parameters, gradients and optimizer states
after ZeRO sharding, activations held (with the logits), and the rest (communication buckets,
ZeRO-3's gathered layers, pipeline receive buffers, framework, the allocator's reserve).

Pure functions called from :func:`meshplan.cost.batch.rank_cost`; no Python branching on plan
values (``np.where`` only), as everywhere in the vectorised cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import INTERLEAVED, ZERO_BUBBLE, PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.layer import LayerCost, activation_bytes, optimizer_state_bytes_per_param, param_bytes_per_param
from meshplan.cost.osdp import OsdpCost
from meshplan.cost.pipeline import head_microbatches_held, in_flight_chunks, recv_buffers_held
from meshplan.cost.plan_terms import PlanTerms
from meshplan.cost.precision import fp8_primary_weights, gathered_bytes_per_param, weight_copy_bytes_per_param
from meshplan.spec.cluster import GIB, GPUSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def sharded_bytes(terms: PlanTerms, experts_on: bool, dense_bytes, expert_bytes, stage: int):
    """Bytes per GPU of a state whose dense part is sharded as ZeRO stage ``stage`` shards it over
    the data-parallel group, and whose expert part over the experts' data-parallel group
    (Rajbhandari et al. 2020, Sec. 5). ``experts_on`` False: a dense model, no expert term."""
    if not experts_on:
        return dense_bytes / terms.dense_shards[stage]
    return dense_bytes / terms.dense_shards[stage] + expert_bytes / terms.expert_shards[stage]


@dataclass(frozen=True)
class UnshardedStage:
    """Where FSDP runs under pipelining as torch's PipelineStage does, masks over plans."""

    fsdp_pp: np.ndarray
    """ZeRO-3 with pp > 1."""
    torch_stage: np.ndarray
    """Of those, the zero-bubble schedule where the stack keeps the stage unsharded
    (Calibration.zero_bubble_keeps_unsharded)."""
    interleaved: np.ndarray
    """Of ``fsdp_pp``, the interleaved schedule over more than one virtual stage per rank."""


def unsharded_stage(plans: PlanArrays, calib: Calibration) -> UnshardedStage:
    fsdp_pp = (plans.zero >= 3) & (plans.pp > 1)
    return UnshardedStage(fsdp_pp=fsdp_pp, torch_stage=fsdp_pp & (plans.schedule == ZERO_BUBBLE)
                          & calib.zero_bubble_keeps_unsharded,
                          interleaved=fsdp_pp & (plans.schedule == INTERLEAVED) & (plans.vpp > 1))


def accumulated_grad_params(terms: PlanTerms, stage: UnshardedStage, *, layers, total_params,
                            layer_params, chunk_layers=None):
    """Parameters whose gradients a rank holds unsharded at once where FSDP accumulates them over
    the micro-batches under pipelining (Calibration.fsdp_pp_accumulates_unsharded_grads).

    torch's pipelining runs FSDP's post-backward (the reduce-scatter of the accumulated gradients,
    which frees them, and the reshard) right after each stage's last backward, stage by stage: torch
    2.5-2.6 stage.py ``backward_maybe_with_nosync`` calls ``run_post_backward`` when the schedule
    passes ``last_backward`` (counted per stage by PipelineScheduleMulti; torchtitan's 2024-12 runs
    used torch 1963fc8, between the two); torch 2.13
    schedules.py ``_add_reduce_grad`` places the REDUCE_GRAD action "just after the last
    backward-like" action of each stage. The interleaved schedule runs a rank's backwards in groups
    of p micro-batches per virtual stage, the last one first (Narayanan et al. 2021 Sec. 2.2;
    torch ScheduleInterleaved1F1B ``backward_stage_index``, Megatron-Core ``get_model_chunk_id``):
    with m <= p micro-batches there is one group, so a virtual stage's backwards all end before
    the next one's begin and the rank holds one virtual stage's gradients at a time. That is its
    largest: ``chunk_layers`` layers (None: ceil(layers / v), exact for the even split, whose
    chunks differ by at most one layer) beside the embedding / head the rank holds, counted
    whichever chunk holds them (an upper bound). Any other schedule, or m > p (the groups cycle
    and every virtual stage has begun its backward before any ends): all the rank's parameters."""
    layers = np.asarray(layers, dtype=float)
    chunk = np.ceil(layers / terms.v) if chunk_layers is None else np.asarray(chunk_layers, dtype=float)
    one_group = stage.interleaved & (terms.m_float <= terms.pp_float)
    return np.where(one_group, total_params - np.maximum(layers - chunk, 0.0) * layer_params, total_params)


@dataclass(frozen=True)
class RankStates:
    """Per GPU, after ZeRO sharding."""

    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optim_bytes: np.ndarray


def rank_states(training: TrainingSpec, calib: Calibration, layer: LayerCost, terms: PlanTerms,
                stage: UnshardedStage, *, layers, dense_params, expert_params, total_params,
                kept_weight_bytes, experts_on: bool, gpu: GPUSpec | None = None,
                chunk_layers=None) -> RankStates:
    """Weights (ZeRO-3 shards them, OSDP keeps ``kept_weight_bytes`` beyond the shards),
    gradients (ZeRO-2) and optimizer states (ZeRO-1) of a rank holding ``dense_params`` +
    ``expert_params`` parameters before sharding (``total_params`` their sum);
    ``chunk_layers`` the layers of its largest virtual stage (:func:`accumulated_grad_params`)."""
    # the parameter held: bf16 beside an fp32 master, or the fp32 master itself (torch FSDP)
    pb = param_bytes_per_param(calib)
    weights = sharded_bytes(terms, experts_on, dense_params * pb, expert_params * pb, 3)
    weights = weights + kept_weight_bytes
    # fp8/fp4 copies of the layers' linear weights (cost/precision.py; not embedding / LM head)
    copy_b = weight_copy_bytes_per_param(training, calib, gpu)
    if copy_b:
        # fp8 primary weights (--fp8-param-gather): the copies replace the bf16 linear weights
        copy_b = copy_b - calib.weight_bytes_per_param if fp8_primary_weights(training, calib) else copy_b
        weights = weights + sharded_bytes(terms, experts_on, layers * layer.dense_params_per_gpu * copy_b,
                                          expert_params * copy_b, 3)
    gb = calib.grad_bytes_per_param(training.precision)
    grads = sharded_bytes(terms, experts_on, dense_params * gb, expert_params * gb, 2)
    # FSDP + PP as torch's PipelineStage runs it (torchtitan; meshplan's runtime under the
    # zero-bubble split backward): gradients accumulate unsharded in the reduce dtype over the
    # micro-batches and are reduce-scattered once per stage, the stage's weights stay gathered.
    if calib.fsdp_pp_accumulates_unsharded_grads or calib.zero_bubble_keeps_unsharded:
        held = accumulated_grad_params(terms, stage, layers=layers, total_params=total_params,
                                       layer_params=layer.params_per_gpu, chunk_layers=chunk_layers)
        grads = np.where(stage.fsdp_pp & calib.fsdp_pp_accumulates_unsharded_grads, held * gb,
                         np.where(stage.torch_stage, total_params * gb, grads))
    opt_pp = optimizer_state_bytes_per_param(calib, training)
    optim = sharded_bytes(terms, experts_on, dense_params * opt_pp, expert_params * opt_pp, 1)
    return RankStates(weights_bytes=weights, grads_bytes=grads, optim_bytes=optim)


@dataclass(frozen=True)
class RankActivations:
    microbatch_bytes: np.ndarray
    """One micro-batch's activations over the rank's layers (recomputed ones under the policy)."""
    stored_bytes: np.ndarray
    """Those of every chunk in flight (what activation offload can move to the host)."""
    activations_bytes: np.ndarray
    """Peak: stored + one recomputed layer rematerialised + the logits."""
    logits_bytes: np.ndarray


def rank_activations(plans: PlanArrays, calib: Calibration, layer: LayerCost, terms: PlanTerms, *,
                     rank, layers, recomputed, head_share, logits_fraction,
                     hidden_bytes_per_token: float = 0.0, chunk_weight=1.0,
                     attention_transient_bytes=0.0) -> RankActivations:
    """Activations held on pipeline rank ``rank`` at its peak (Korthikanti et al. 2022, Sec. 4 per
    layer; in-flight chunks per schedule from cost.pipeline), ``head_share`` of the LM head's
    logits (``logits_fraction`` of them at once: OSDP's chunked head). ``hidden_bytes_per_token``
    (D x element bytes) is read where the stack keeps the LM head's gathered input
    (Calibration.sp_saves_gathered_inputs). ``chunk_weight``: the interleaved schedule's held
    layers over an even mix of the rank's chunks (cost/chunk_inflight.py; 1 for equal chunks).
    ``attention_transient_bytes``: what one layer's attention holds beyond its activations while
    it runs (torch's ring attention, cost/cp_ring_memory.py): alive only inside a layer's
    backward, which starts after the loss's backward has freed the logits, so the peak holds the
    larger of the two."""
    act_policy = terms.act_policy
    per_mb = recomputed * act_policy + (layers - recomputed) * layer.act_none_bytes
    held = in_flight_chunks(rank, terms.pp_float, terms.v, terms.m_float, plans.schedule,  # floats: no re-conversion
                            plans.vocab_parallel)
    stored = held * per_mb / terms.v * chunk_weight
    # Backward of a recomputed layer rematerialises what was dropped, one layer at a time.
    acts = stored + np.where(recomputed > 0, layer.act_none_bytes - act_policy, 0.0)
    # Kept logits for every micro-batch the head stage holds (GPipe: all m), the loss's transients once.
    head_mbs = head_microbatches_held(terms.m_float, plans.schedule)
    loss_transient = calib.loss_transient_bytes_per_element
    if calib.loss_parallel_transient_bytes_per_element:  # vocabulary-parallel loss, tp > 1 only
        loss_transient = loss_transient + np.where(terms.t > 1, calib.loss_parallel_transient_bytes_per_element,
                                                   0.0)
    logits = head_share * terms.tokens_per_microbatch * terms.vocab_per_tp_rank * logits_fraction * (calib.logits_bytes_per_element * head_mbs
                                                                  + loss_transient)
    if calib.sp_saves_gathered_inputs:  # the head's input gathered under SP: T x D, not T/t x D
        gathered = np.where(plans.sp, terms.tokens_per_microbatch * (1.0 - 1.0 / terms.t), 0.0) * hidden_bytes_per_token
        logits = logits + head_share * head_mbs * gathered
    transient = logits if np.isscalar(attention_transient_bytes) and attention_transient_bytes == 0.0 \
        else np.maximum(logits, attention_transient_bytes)
    # Every micro-batch's last-stage output, kept by torch's pipelining until the step ends
    # (Calibration.pp_kept_output_bytes_per_element), and their merge (torch.cat) once the last
    # backward has freed the layers' activations: the kept outputs plus the larger of the two.
    peak = acts + transient
    kept = 0.0
    if calib.pp_kept_output_bytes_per_element:
        kept = np.where(terms.pp_float > 1, head_share * terms.tokens_per_microbatch * terms.vocab_per_tp_rank
                        * calib.pp_kept_output_bytes_per_element * terms.m_float, 0.0)
        peak = np.maximum(peak, kept) + kept
    return RankActivations(microbatch_bytes=per_mb, stored_bytes=stored, activations_bytes=peak,
                           logits_bytes=logits + kept)


def deepspeed_live_params(model: ModelSpec, calib: Calibration, tp):
    """Gathered elements DeepSpeed's ZeRO-3 keeps live at once (Calibration.zero3_max_live_params):
    the current module, the largest linear weight of a layer (``m``, per tensor-parallel rank),
    and what the prefetch holds ahead: a whole next module where modules are larger than the
    prefetch bucket, the window up to the live cap where they are smaller (a bucket added at
    every module, one module released). Upper end of the window; the rank's layers bound it."""
    m = model.hidden_size * max(model.ffn_hidden_size, model.q_size + 2 * model.kv_size) / tp
    cap = calib.zero3_max_live_params
    return m + np.where(m < calib.zero3_prefetch_bucket_params, cap, np.minimum(m, cap))


@dataclass(frozen=True)
class RankOther:
    other_bytes: np.ndarray
    """Buffers, ZeRO-3's gathered layers, receive buffers, framework, the optimizer step's excess
    (cost/step_memory.py) and the allocator's reserve."""
    reserve_bytes: np.ndarray
    gathered_weight_bytes: np.ndarray
    """ZeRO-3's gathered layers and FSDP's backward buffers, at ZeRO-1/2 an FSDP2 stack's
    reduce-scatter input alone (of ``other_bytes``)."""


def rank_other(model: ModelSpec, training: TrainingSpec, plans: PlanArrays, calib: Calibration,
               terms: PlanTerms, stage: UnshardedStage, osdp: OsdpCost, *, rank, layers,
               allocated_bytes, step_excess_bytes=0.0, gpu: GPUSpec | None = None,
               rest_params=0.0, head_weight_params=0.0, logits_bytes=0.0,
               attention_transient_bytes=0.0) -> RankOther:
    """What a rank holds beyond its states and activations; ``allocated_bytes`` (weights + grads +
    optimizer + activations left on the GPU) and ``step_excess_bytes`` (what the optimizer step's
    peak adds over the backward's, cost/step_memory.py) set the allocator's reserve;
    ``rest_params`` the rank's parameters outside its layers (embedding, LM head shares),
    ``head_weight_params`` its share of the LM head's weight (V/t x D, tied or not),
    ``logits_bytes`` the logits and loss transients its activations hold at the loss,
    ``attention_transient_bytes`` what one attention layer's backward holds (rank_activations
    charged the larger of the two)."""
    z = plans.zero
    # FSDP unshards the current layer and prefetches the next: up to two layers gathered beyond
    # the shard already held (Zhao et al. 2023 Sec. 3.2). With pipelining, the whole stage stays
    # unsharded between its micro-batches (Calibration.fsdp_pp_keeps_unsharded).
    # OSDP: the sharded groups only, the MLP a slice at a time (all of them when the stage stays
    # unsharded).
    gathered, gathered_p = np.minimum(2.0, layers), osdp.gathered_layer_params
    if (calib.fsdp_pp_keeps_unsharded or calib.zero_bubble_keeps_unsharded) and np.any(z >= 3):
        keep = (stage.fsdp_pp & calib.fsdp_pp_keeps_unsharded) | stage.torch_stage
        gathered = np.where(keep, layers, gathered)
        if osdp.active:
            gathered_p = np.where(keep, osdp.sharded_layer_params, gathered_p)
    gathered_params = gathered * gathered_p
    # Beyond the shard already held, unless the shard is the fp32 parameter (torch FSDP,
    # Calibration.params_are_master) or the stack gathers into a buffer of its own (DeepSpeed):
    # then the bf16 gathered parameters are all new.
    not_held = 1.0 if calib.params_are_master else 1.0 - 1.0 / terms.zero_ranks
    if calib.zero3_max_live_params:
        gathered_params = np.minimum(layers * gathered_p, deepspeed_live_params(model, calib, terms.t))
        not_held = 1.0
    gathered_b = gathered_bytes_per_param(training, calib, gpu)
    z3_bytes = gathered_params * gathered_b * not_held
    rs_bytes = 0.0
    if calib.fsdp_reduce_scatter_bytes_per_param:  # one layer's gradients on their way to the reduce-scatter
        # (none in the backward where the stage keeps torch's PipelineStage behaviour under the
        # zero-bubble split backward: gradients accumulate unsharded, reduced after the last one)
        rs_bytes = np.where(stage.torch_stage, 0.0, gathered_p * calib.fsdp_reduce_scatter_bytes_per_param)
    if calib.fsdp_root_gathered_in_backward:
        # FSDP's root unit gathered from the LM head's backward to the root's post-backward, the
        # last, with the LM head's 16-bit gradient made there, and the layers' reduce-scatter input:
        # all live only once the loss's backward is over, when its logits and transients
        # (``logits_bytes``, counted with the activations) are freed; they are live beside one
        # attention layer's backward transient (cost/cp_ring_memory.py). The activations charged the
        # larger of the logits and that transient; these add what the layers' backward phase, the
        # buffers plus the transient, exceeds it by.
        backward_bytes = (rest_params * gathered_b * not_held + head_weight_params * calib.weight_bytes_per_param
                          + rs_bytes)
        charged = np.maximum(logits_bytes, attention_transient_bytes)
        z3_bytes = z3_bytes + np.maximum(backward_bytes + attention_transient_bytes - charged, 0.0)
        # ZeRO-1/2 in meshplan's runtime (FSDP2 with reshard_after_forward=False: runtime/
        # parallelize.apply_dp) reduce-scatter each layer's gradients through the same fp32 input
        # buffer; nothing else is regathered. (torchtitan shards with FSDP2 as ZeRO-3 only.)
        rs_only = np.maximum(rs_bytes + attention_transient_bytes - charged, 0.0)
    else:
        z3_bytes = z3_bytes + rs_bytes
        rs_only = 0.0
    fsdp_sharded = (z >= 1) & (np.asarray(terms.zero_ranks) > 1)
    z3_buffers = np.where(z >= 3, z3_bytes, np.where(fsdp_sharded, rs_only, 0.0))
    step_peak = not (isinstance(step_excess_bytes, float) and step_excess_bytes == 0.0)  # no pass over 0
    if step_peak:
        allocated_bytes = allocated_bytes + step_excess_bytes
    reserve = calib.allocator_fragmentation * allocated_bytes
    # Pipeline receive buffers, when the stack preallocates one per micro-batch (torch's pipelining):
    # the (b, S/c, D) hidden state, /t under sequence parallel (what the stages send).
    hidden_bytes = (terms.tokens_per_microbatch * model.hidden_size * activation_bytes(training.precision)
                    / np.where(plans.sp, plans.tp, 1))
    recv_buffers = np.where(calib.pp_preallocated_recv_buffers,
                            recv_buffers_held(rank, plans.pp, terms.v, terms.m_float) * hidden_bytes, 0.0)
    other = (calib.comm_bucket_bytes + z3_buffers + recv_buffers + calib.framework_overhead_gib * GIB
             + reserve)
    if step_peak:
        other = other + step_excess_bytes
    return RankOther(other_bytes=other, reserve_bytes=reserve, gathered_weight_bytes=z3_buffers)
