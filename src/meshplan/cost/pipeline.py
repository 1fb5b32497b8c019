"""Pipeline composition: step time from per-rank micro-batch times; in-flight micro-batches.

With p pipeline ranks, v virtual stages per rank and m micro-batches, the schedules of
Narayanan et al. 2021 (Sec. 2.2) take m * t + bubble, where t is the slowest rank's time for one
micro-batch (forward + backward over all its chunks) and the bubble is (p - 1) / v * t
(GPipe and 1F1B: v = 1). Zero-bubble schedules (Qi et al. 2024) leave a calibrated residual.

Activations in flight on pipeline rank r (units: micro-batch x chunk, a chunk being one virtual
stage): GPipe keeps all m*v; 1F1B keeps p - r (the first rank the most); interleaved 1F1B keeps
its warm-up count + 1 = 2(p - r - 1) + (v - 1) p + 1 (Megatron-LM's schedule; for r = 0 that
is L(1 + (p-1)/(pv)) layers' worth, Korthikanti et al. 2022 Sec. 4.2.3); zero-bubble H1 keeps
the 1F1B count. With vocabulary parallelism 1F1B warms up as deep as interleaved 1F1B with
v = 1, 2(p - r - 1) + 1, so that the output passes of all ranks line up (runtime/vocab_parallel.py).
Never more than m*v.
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.arrays import GPIPE, INTERLEAVED, ONE_F_ONE_B, ZERO_BUBBLE
from meshplan.cost.calibration import Calibration


def bubble_time(rank_time_s, pp, vpp, schedule, calib: Calibration):
    """Idle time of the slowest rank: (p-1)/v * t, times the zero-bubble residual."""
    p = np.asarray(pp, dtype=float)
    v = np.asarray(vpp, dtype=float)
    residual = np.where(np.asarray(schedule) == ZERO_BUBBLE, calib.zero_bubble_residual, 1.0)
    return (p - 1) / v * rank_time_s * residual


def pipeline_time(rank_time_s, num_microbatches, pp, vpp, schedule, calib: Calibration):
    """(total, bubble) seconds of the forward/backward part of one step."""
    bubble = bubble_time(rank_time_s, pp, vpp, schedule, calib)
    return num_microbatches * rank_time_s + bubble, bubble


def in_flight_chunks(rank, pp, vpp, num_microbatches, schedule, vocab_parallel=False):
    """Micro-batch x chunk activation sets held at the peak by pipeline ``rank``."""
    r = np.asarray(rank, dtype=float)
    p = np.asarray(pp, dtype=float)
    v = np.asarray(vpp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    sched = np.asarray(schedule)
    one_f_one_b = p - r
    interleaved = 2 * (one_f_one_b - 1) + (v - 1) * p + 1
    all_chunks = m * v
    deep = ((sched == INTERLEAVED) & (v > 1)) | ((sched == ONE_F_ONE_B) & np.asarray(vocab_parallel, dtype=bool))
    held = np.where(sched == GPIPE, all_chunks, np.where(deep, interleaved, one_f_one_b * v))
    return np.minimum(held, all_chunks)


def head_microbatches_held(num_microbatches, schedule):
    """Micro-batches whose logits (and the loss's kept fp32 log-softmax) the LM-head stage holds at
    its peak. GPipe runs every forward, the loss included (torch.distributed.pipelining computes
    the loss in the last stage's forward), before the first backward: all m (Huang et al. 2019,
    Sec. 2.2). The 1F1B family runs each micro-batch's backward on the last stage right after its
    forward (Narayanan et al. 2021, Sec. 2.2): one."""
    m = np.asarray(num_microbatches, dtype=float)
    return np.where(np.asarray(schedule) == GPIPE, m, 1.0)


def recv_buffers_held(rank, pp, vpp, num_microbatches):
    """Receive buffers a pipeline rank holds when its stages preallocate one per micro-batch
    (torch.distributed.pipelining: each PipelineStage allocates, as its schedule starts, an input
    activation buffer per micro-batch unless it is the first stage and an output-gradient buffer
    per micro-batch unless it is the last, kept for the step; torch 2.13 stage.py
    ``_prepare_forward_infra`` / ``_prepare_backward_infra``). Units: micro-batch activations."""
    r = np.asarray(rank, dtype=float)
    p = np.asarray(pp, dtype=float)
    v = np.asarray(vpp, dtype=float)
    ends = (r == 0).astype(float) + (r == p - 1).astype(float)  # the first stage's input, the last's gradient
    return np.where(p > 1, np.asarray(num_microbatches, dtype=float) * (2.0 * v - ends), 0.0)


def rank_layers_even(num_layers: int, rank, pp, vpp):
    """Layers on pipeline ``rank`` under ``plan.even_split`` (earlier stages take the remainder;
    virtual stage i lives on rank i % pp)."""
    r = np.asarray(rank, dtype=np.int64)
    p = np.asarray(pp, dtype=np.int64)
    v = np.asarray(vpp, dtype=np.int64)
    base, extra = np.divmod(num_layers, p * v)
    chunks_with_extra = np.clip(-((r - extra) // p), 0, v)  # ceil((extra - r) / p) in [0, v]
    return v * base + chunks_with_extra


def rank_of_layer_even(layer: int, num_layers: int, pp, vpp):
    """Pipeline rank holding layer ``layer`` (0-based) under ``plan.even_split``: the first
    ``extra`` virtual stages take ``base + 1`` layers, the others ``base``; stage i on rank i % pp."""
    p = np.asarray(pp, dtype=np.int64)
    stages = p * np.asarray(vpp, dtype=np.int64)
    base, extra = np.divmod(num_layers, stages)
    big = extra * (base + 1)  # layers in the stages with one more
    stage = np.where(layer < big, layer // (base + 1), extra + (layer - big) // np.maximum(base, 1))
    return stage % p
