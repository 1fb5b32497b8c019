"""What one pipeline rank costs (:class:`RankCost`, arrays over plans) and how the ranks' costs
compose into a step (:func:`compose`: max over the ranks, the pipeline schedule, throughput and
fits). :func:`meshplan.cost.batch.rank_cost` fills a ``RankCost``; the even split
(``estimate_batch``), the layer-split estimate (cost/split_batch.py) and the search compose them here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.device_memory import device_fits, held_peak_bytes
from meshplan.cost.flops import model_flops_per_token
from meshplan.cost.offload import host_budget_bytes
from meshplan.cost.pipeline import pipeline_time
from meshplan.cost.plan_terms import num_microbatches
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
    """Buffers, ZeRO-3 gathered layers, framework overhead, the optimizer step's excess, and the
    allocator's reserve (``reserve_bytes`` of it: kept in one sum so the search adds five arrays,
    not six)."""
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
    """Of ``activations_bytes``: the logits and loss transients at once (OSDP: one chunk's), and
    the LM head's gathered input where the stack keeps it (Calibration.sp_saves_gathered_inputs)."""
    step_excess_bytes: np.ndarray | float = 0.0
    """Of ``other_bytes``: what the optimizer step's gradient copies add over the backward's peak
    (cost/step_memory.py)."""

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


@dataclass(frozen=True)
class BatchEstimate:
    """Arrays over plans (even split, all-layer recompute)."""

    step_time_s: np.ndarray
    bubble_s: np.ndarray
    peak_memory_bytes: np.ndarray
    """Peak reserved (allocated + allocator reserve); ``fits`` adds what lies outside the
    allocator (cost/device_memory.py: device_fits)."""
    peak_allocated_bytes: np.ndarray | None
    """Peak allocated (no allocator reserve); None when ``compose`` was not asked for it (the
    search scores on reserved alone)."""
    tokens_per_s_per_gpu: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    fits: np.ndarray
    """The device peak fits the GPU's memory (cost/device_memory.py: device_fits), and the
    offloaded tensors fit in the GPU's share of host memory."""
    host_memory_bytes: np.ndarray | float = 0.0
    """Host memory of the GPU whose offloaded tensors take the most."""


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
    need_allocated = allocated or calib.allocator_expandable_segments
    peak_allocated = _most([r.allocated_bytes for r in ranks]) if need_allocated else None
    held = held_peak_bytes(peak, peak_allocated, calib)  # what "fits" counts (cost/device_memory.py)
    gpus = plans.world_size
    tokens_per_gpu = training.tokens_per_step / step / gpus
    tflops = tokens_per_gpu * model_flops_per_token(model, training.seq_len) / 1e12
    mfu = tflops * 1e12 / cluster.gpu.peak_flops(training.precision)
    host_fits = (host == 0) | (host <= host_budget_bytes(cluster))
    return BatchEstimate(step_time_s=step, bubble_s=bubble, peak_memory_bytes=peak,
                         peak_allocated_bytes=peak_allocated if allocated else None,
                         tokens_per_s_per_gpu=tokens_per_gpu, tflops_per_gpu=tflops, mfu=mfu,
                         fits=device_fits(held, plans, calib, cluster.gpu.memory_bytes) & host_fits, host_memory_bytes=host)
