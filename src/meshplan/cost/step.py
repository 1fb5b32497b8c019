"""``estimate()``: the cost of one Plan as breakdowns (time, memory, per pipeline rank).

It evaluates every pipeline rank with the vectorised functions of :mod:`meshplan.cost.batch`
on a one-plan ``PlanArrays``, using the plan's own layer split and per-stage recompute counts,
so it agrees with ``estimate_batch`` whenever the split is even and every layer is recomputed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import RankCost, compose, num_microbatches, plan_terms, rank_cost
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.chunk_inflight import largest_chunk_layers, plan_chunk_weight
from meshplan.cost.device_memory import held_peak_bytes, outside_allocator_bytes
from meshplan.cost.layer import layer_cost
from meshplan.cost.offload import check_offload_hardware, host_budget_bytes
from meshplan.cost.pipeline import in_flight_chunks
from meshplan.cost.rank_layers import lead_on_rank, needs_rank_mix, stack_layers
from meshplan.cost.expert_load import LoadStats, load_stats
from meshplan.plan import ExpertPlacement, Plan
from meshplan.spec.cluster import GIB, ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step on the critical path; the four main fields sum to the step."""

    compute_s: float
    """Forward, backward and recompute math of the slowest rank over all micro-batches."""
    exposed_communication_s: float
    """TP/CP/EP/pipeline/ZeRO-3 communication per micro-batch and the data-parallel reduce, as
    far as they are not hidden behind compute."""
    bubble_s: float
    optimizer_s: float
    recompute_s: float
    """Of compute_s: the recomputation."""
    microbatch_comm_total_s: float
    """All per-micro-batch communication of the slowest rank, hidden or not, over the step."""
    dp_comm_total_s: float
    """Data-parallel communication per step, hidden or not."""
    num_microbatches: int
    exposed_tp_s: float = 0.0
    """Of exposed_communication_s: tensor-parallel collectives (Megatron f/g, SP gathers)."""
    exposed_cp_s: float = 0.0
    """Context-parallel K/V exchange (ring or all-to-all)."""
    exposed_ep_s: float = 0.0
    """Expert-parallel token all-to-alls."""
    exposed_pp_s: float = 0.0
    """Pipeline send/recv of activations and their gradients."""
    exposed_zero_s: float = 0.0
    """Per-micro-batch ZeRO traffic: ZeRO-3 gathers and reduce-scatters, ZeRO-2's reduce-scatter
    of every accumulated micro-batch."""
    exposed_dp_s: float = 0.0
    """The step's data-parallel gradient reduce (and ZeRO-1/2 parameter gather)."""
    exposed_host_s: float = 0.0
    """The runtime's host time per collective (Calibration.*_layer_overhead_s), never hidden."""
    offload_s: float = 0.0
    """Host-device copies of offloaded tensors left exposed, and the host's optimizer step
    (CPU Adam) with its gradient download and weight upload (:mod:`meshplan.cost.offload`)."""
    offload_total_s: float = 0.0
    """All host-device copies per step, hidden or not, plus the host's optimizer step."""
    osdp_compute_s: float = 0.0
    """Of compute_s: OSDP's smaller MLP GEMMs and their launches, the chunked LM head's
    recomputed forward (:mod:`meshplan.cost.osdp`)."""
    osdp_gather_latency_s: float = 0.0
    """Of microbatch_comm_total_s: the latency of OSDP's extra gathers (MLP slices)."""

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.exposed_communication_s + self.bubble_s + self.optimizer_s
                + self.offload_s)

    def terms_s(self) -> dict[str, float]:
        """The step as named terms that sum to it: what `plan --compare` attributes a gap to."""
        return {
            "compute": self.compute_s - self.recompute_s, "recompute": self.recompute_s,
            "exposed TP": self.exposed_tp_s, "exposed CP": self.exposed_cp_s,
            "exposed EP": self.exposed_ep_s, "exposed PP p2p": self.exposed_pp_s,
            "exposed ZeRO per micro-batch": self.exposed_zero_s, "exposed DP": self.exposed_dp_s,
            "collective host overhead": self.exposed_host_s,
            "bubble": self.bubble_s, "optimizer": self.optimizer_s, "offload": self.offload_s,
        }


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of the most loaded pipeline rank."""

    parameters_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    reserve_bytes: float = 0.0
    """Reserved by the caching allocator beyond the allocated peak (fragmentation)."""

    @property
    def allocated_bytes(self) -> float:
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_bytes)
    host_bytes: float = 0.0
    """Offloaded tensors in host memory (not part of ``total_bytes``, the GPU's)."""
    kept_weight_bytes: float = 0.0
    """Of parameters_bytes: OSDP's groups kept gathered, beyond their shards."""
    gathered_weight_bytes: float = 0.0
    """Of other_bytes: ZeRO-3's gathered layers (OSDP: the sharded groups, the MLP a slice at a time)."""
    logits_bytes: float = 0.0
    """Of activations_bytes: the logits and loss transients at once (OSDP: one chunk's)."""
    step_excess_bytes: float = 0.0
    """Of other_bytes: what the optimizer step's gradient copies add over the backward's peak
    (cost/step_memory.py)."""

    def osdp_gib(self) -> dict[str, float]:
        """The OSDP-relevant parts of the categories above (each already counted in one)."""
        return {"kept_gathered": self.kept_weight_bytes / GIB,
                "gathered_buffer": self.gathered_weight_bytes / GIB, "logits": self.logits_bytes / GIB}

    @property
    def total_bytes(self) -> float:
        """Peak reserved: allocated + reserve."""
        return self.allocated_bytes + self.reserve_bytes

    def gib(self) -> dict[str, float]:
        return {
            "parameters": self.parameters_bytes / GIB,
            "gradients": self.gradients_bytes / GIB,
            "optimizer": self.optimizer_bytes / GIB,
            "activations": self.activations_bytes / GIB,
            "other": self.other_bytes / GIB,
            "allocator_reserve": self.reserve_bytes / GIB,
        }


@dataclass(frozen=True)
class StageCost:
    """One pipeline rank (all its virtual stages)."""

    rank: int
    layers: int
    recomputed_layers: int
    in_flight_microbatches: float
    microbatch_time_s: float
    memory: MemoryBreakdown
    mtp_modules: int = 0
    """Multi-token-prediction modules this rank runs besides its ``layers`` (``Plan.mtp_stage``)."""


@dataclass(frozen=True)
class Estimate:
    plan: Plan
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    """Model FLOPs basis (6N + 12LSq per token, no recompute)."""
    mfu: float
    peak_memory_gib: float
    """Peak reserved (allocated + allocator reserve)."""
    gpu_memory_gib: float
    fits: bool
    """The device peak the GPU must hold is at most ``gpu_memory_gib`` (cost/device_memory.py:
    what "fits" means; ``peak_device_gib`` less the reserve an expandable-segments allocator
    gives back), and offloaded tensors fit the host's share."""
    memory_shortfall_gib: float
    """That device peak beyond ``gpu_memory_gib`` (0 when it fits the GPU)."""
    time: TimeBreakdown
    memory: MemoryBreakdown
    stages: tuple[StageCost, ...]
    peak_allocated_gib: float = 0.0
    """Peak allocated (torch.cuda.max_memory_allocated): no reserve."""
    peak_device_gib: float = 0.0
    """What the GPU has in use at the peak (nvidia-smi): the peak reserved plus the CUDA context
    and NCCL's buffers, outside the caching allocator (cost/device_memory.py)."""
    fit_memory_gib: float = 0.0
    """The device peak ``fits`` compares with ``gpu_memory_gib``: the held peak (reserved, or
    allocated under expandable segments) plus the CUDA context and NCCL's buffers
    (cost.device_memory.fit_bytes); the search's ``peak_memory_bytes`` of the same plan."""
    host_memory_gib: float = 0.0
    """Host memory of the GPU whose offloaded tensors take the most."""
    host_memory_budget_gib: float = 0.0
    """That GPU's share of the node's usable host memory (0: no offload)."""
    expert_load: LoadStats | None = None
    """The training's expert load on this plan's placement (cost/expert_load.py); None without one."""

    def to_dict(self) -> dict[str, Any]:
        t = self.time
        return {
            "plan": self.plan.notation(),
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib,
            "peak_reserved_gib": self.peak_memory_gib,
            "peak_allocated_gib": self.peak_allocated_gib,
            "peak_device_gib": self.peak_device_gib,
            "fit_memory_gib": self.fit_memory_gib,
            "gpu_memory_gib": self.gpu_memory_gib,
            "fits": self.fits,
            "memory_shortfall_gib": self.memory_shortfall_gib,
            "memory_gib": self.memory.gib(),
            "time_s": {
                "compute": t.compute_s,
                "exposed_communication": t.exposed_communication_s,
                "bubble": t.bubble_s,
                "optimizer": t.optimizer_s,
                "recompute": t.recompute_s,
                "microbatch_comm_total": t.microbatch_comm_total_s,
                "dp_comm_total": t.dp_comm_total_s,
                "offload": t.offload_s,
                "offload_total": t.offload_total_s,
                "osdp_compute": t.osdp_compute_s,
                "osdp_gather_latency": t.osdp_gather_latency_s,
            },
            "osdp_memory_gib": self.memory.osdp_gib(),
            "terms_s": t.terms_s(),
            "host_memory_gib": self.host_memory_gib,
            "host_memory_budget_gib": self.host_memory_budget_gib,
            "num_microbatches": t.num_microbatches,
            "expert_load": asdict(self.expert_load) if self.expert_load else None,
            "stages": [
                {"rank": s.rank, "layers": s.layers, "mtp_modules": s.mtp_modules,
                 "recomputed_layers": s.recomputed_layers,
                 "in_flight_microbatches": s.in_flight_microbatches,
                 "microbatch_time_s": s.microbatch_time_s,
                 "memory_gib": s.memory.gib(), "total_memory_gib": s.memory.total_bytes / GIB}
                for s in self.stages
            ],
        }


def _f(a: np.ndarray) -> float:
    return float(np.asarray(a).reshape(-1)[0])


def estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
             calib: Calibration | None = None) -> Estimate:
    """Cost of ``plan``; the plan must be valid for the model, batch and GPU count."""
    plan.validate_for(model, training, cluster.num_gpus)
    plan = plan.with_defaults(model)
    if plan.offload:
        check_offload_hardware(cluster)
    calib = calib or calibration_for(cluster.gpu)
    arrays = PlanArrays.from_plans([plan])
    layer = layer_cost(model, cluster, training, arrays, calib)
    stack = stack_layers(model, cluster, training, arrays, calib) if needs_rank_mix(model) else None
    p = plan.dims.pp
    m = int(num_microbatches(training, arrays)[0])
    ranks: list[RankCost] = []
    stages: list[StageCost] = []
    for r in range(p):
        layers, rec = plan.layers_on_rank(r), plan.recomputed_on_rank(r)
        rc = rank_cost(model, cluster, training, arrays, calib, layer, rank=r, layers=layers,
                       recomputed=rec, has_embedding=r == 0, has_head=r == p - 1, has_mtp=r == plan.mtp_rank,
                       offloaded_layers=plan.offloaded_on_rank(r), chunk_weight=plan_chunk_weight(plan, r, m),
                       stack=stack, lead=lead_on_rank(model, plan.stage_layers, p, r),
                       chunk_layers=largest_chunk_layers(plan, r))
        ranks.append(rc)
        stages.append(StageCost(
            rank=r, layers=layers, recomputed_layers=rec,
            in_flight_microbatches=_f(in_flight_chunks(r, p, plan.vpp, m, arrays.schedule, arrays.vocab_parallel)) / plan.vpp,
            microbatch_time_s=_f(rc.microbatch_s), memory=_memory(rc),
            mtp_modules=model.mtp_num_layers if r == plan.mtp_rank else 0))
    batch = compose(model, cluster, training, arrays, ranks, calib, allocated=True)
    slow = int(np.argmax([_f(r.microbatch_s) for r in ranks]))
    tail = int(np.argmax([_f(r.step_extra_s) for r in ranks]))
    heavy = int(np.argmax([_f(r.memory_bytes) for r in ranks]))
    rs, rt = ranks[slow], ranks[tail]
    kinds = _exposed_by_kind(model, cluster, training, arrays, calib, layer, rs, stages[slow].layers,
                             has_mtp=slow == plan.mtp_rank)
    time = TimeBreakdown(
        compute_s=m * _f(rs.compute_s + rs.recompute_s),
        exposed_communication_s=m * _f(rs.comm_exposed_s) + _f(rt.dp_exposed_s),
        bubble_s=_f(batch.bubble_s), optimizer_s=_f(rt.optimizer_s),
        recompute_s=m * _f(rs.recompute_s), microbatch_comm_total_s=m * _f(rs.comm_total_s),
        dp_comm_total_s=_f(rt.dp_total_s), num_microbatches=m,
        **{k: m * v for k, v in kinds.items()}, exposed_dp_s=_f(rt.dp_exposed_s),
        offload_s=m * _f(rs.offload_exposed_s) + _f(rt.offload_step_s),
        offload_total_s=m * _f(rs.offload_total_s) + _f(rt.offload_step_s),
        osdp_compute_s=m * _f(rs.osdp_compute_s * np.ones(1)),
        osdp_gather_latency_s=m * _f(rs.osdp_gather_latency_s * np.ones(1)))
    peak_gib = _f(batch.peak_memory_bytes) / GIB
    outside_gib = _f(outside_allocator_bytes(arrays, calib)) / GIB
    device_gib = peak_gib + outside_gib
    held_gib = held_peak_bytes(peak_gib, _f(batch.peak_allocated_bytes) / GIB, calib)  # what "fits" counts
    required_gib = held_gib + outside_gib
    gpu_gib = cluster.gpu.memory_gib
    step = _f(batch.step_time_s)
    return Estimate(
        plan=plan, step_time_s=step, tokens_per_s=training.tokens_per_step / step,
        tokens_per_s_per_gpu=_f(batch.tokens_per_s_per_gpu), tflops_per_gpu=_f(batch.tflops_per_gpu),
        mfu=_f(batch.mfu), peak_memory_gib=peak_gib, gpu_memory_gib=gpu_gib,
        fits=bool(batch.fits[0]), memory_shortfall_gib=max(0.0, required_gib - gpu_gib),
        time=time, memory=stages[heavy].memory, stages=tuple(stages),
        peak_allocated_gib=_f(batch.peak_allocated_bytes) / GIB,
        peak_device_gib=device_gib, fit_memory_gib=required_gib,
        host_memory_gib=_f(batch.host_memory_bytes) / GIB,
        host_memory_budget_gib=host_budget_bytes(cluster) / GIB if plan.offload else 0.0,
        expert_load=_expert_load(model, training, plan))


def _expert_load(model: ModelSpec, training: TrainingSpec, plan: Plan) -> LoadStats | None:
    if training.expert_load is None or not model.is_moe:
        return None
    return load_stats(training.expert_load, model.moe_num_experts, plan.dims.ep,
                      balanced_placement=plan.expert_placement == ExpertPlacement.BALANCED,
                      replicas=plan.expert_replicas, capacity_factor=training.moe_capacity_factor)


def _exposed_by_kind(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, arrays: PlanArrays,
                     calib: Calibration, layer, rank: RankCost, layers: int, has_mtp: bool) -> dict[str, float]:
    """Per micro-batch, the slowest rank's exposed communication split by kind. ``rank_cost``
    adds the layers' TP/CP/EP and host terms, the pipeline p2p and the per-micro-batch ZeRO
    traffic; the split re-reads the first from the layer cost, the second from the p2p term, and
    the ZeRO part is what remains, so the kinds add up to ``comm_exposed_s`` exactly."""
    n = layers + (model.mtp_num_layers if has_mtp else 0)  # MTP modules count as layers (rank_cost)
    tp, cp, ep = (n * _f(getattr(layer, f)) for f in ("tp_exposed_s", "cp_exposed_s", "ep_exposed_s"))
    layer_comm = n * _f(layer.fwd_comm_exposed_s + layer.bwd_comm_exposed_s)
    terms = plan_terms(model, cluster, training, arrays, calib, layer)
    # the pipeline's p2p and, with vocabulary parallelism, its per-micro-batch sync over the stages
    pp = _f(terms.p2p_s) * (1.0 - calib.pp_p2p_overlap) + _f(terms.vocab_sync_s)  # the latter never hidden
    return {"exposed_tp_s": tp, "exposed_cp_s": cp, "exposed_ep_s": ep, "exposed_pp_s": pp,
            "exposed_host_s": max(layer_comm - tp - cp - ep, 0.0),
            "exposed_zero_s": max(_f(rank.comm_exposed_s) - layer_comm - pp, 0.0)}


def _memory(rc: RankCost) -> MemoryBreakdown:
    return MemoryBreakdown(
        parameters_bytes=_f(rc.parameters_bytes), gradients_bytes=_f(rc.gradients_bytes),
        optimizer_bytes=_f(rc.optimizer_bytes), activations_bytes=_f(rc.activations_bytes),
        other_bytes=_f(rc.other_bytes - rc.reserve_bytes), reserve_bytes=_f(rc.reserve_bytes),
        host_bytes=_f(rc.host_bytes * np.ones(1)), kept_weight_bytes=_f(rc.kept_weight_bytes * np.ones(1)),
        gathered_weight_bytes=_f(rc.gathered_weight_bytes * np.ones(1)), logits_bytes=_f(rc.logits_bytes * np.ones(1)),
        step_excess_bytes=_f(rc.step_excess_bytes * np.ones(1)))
