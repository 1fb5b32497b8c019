"""The tensor-parallel collectives of one layer's backward, as Megatron issues them.

Per sub-block (attention, MLP) the forward runs Megatron's f / g pair: without sequence
parallelism an all-reduce of the row-parallel output (g); with it an all-gather before the
column-parallel linear and a reduce-scatter after the row-parallel one (Korthikanti et al. 2022,
Sec. 4.2.2, Fig. 5). The backward runs their conjugates:

* no SP: f's backward all-reduces the column-parallel linear's input gradient (g's is the identity);
* SP: the reduce-scatter's backward all-gathers the output gradient, the all-gather's backward
  reduce-scatters the input gradient, and, since Megatron keeps only the 1/t sequence shard of
  the column-parallel linear's input, one more all-gather restores that input for the weight
  gradient (Sec. 4.2.2: "an extra all-gather in the back-pass"), unless the stack keeps the
  gathered input (``Calibration.sp_saves_gathered_inputs``: DTensor).

Megatron-LM from 2022 (the code behind Korthikanti et al. 2022; ``LinearWithGradAccumulationAnd
AsyncCommunication`` in megatron/mpu/layers.py) issues the input-gradient all-reduce (or
reduce-scatter) and SP's input re-gather asynchronously, each behind a GEMM of the same linear
(the re-gather behind the input-gradient GEMM, the reduction behind the weight-gradient GEMM);
the output-gradient all-gather stays synchronous (``Calibration.tp_backward_async``). Stacks
with chunked comm overlap hide all of them as they hide the forward's (``Calibration.tp_overlap``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.calibration import Calibration


@dataclass(frozen=True)
class TpBackward:
    """Arrays over plans, one layer, one micro-batch."""

    total_s: np.ndarray
    """Every tensor-parallel collective of the backward, hidden or not."""
    exposed_s: np.ndarray
    """Of which left on the critical path."""


def tp_backward(calib: Calibration, *, sp, parts: float, act_msg_bytes, tp, tp_link: comms.Link,
                bwd_device_s, gemm_s, gather_msg_bytes=None) -> TpBackward:
    """The backward's TP collectives of one layer (module docstring). ``act_msg_bytes``: the
    sub-block's (b, S/c, D) activation; ``bwd_device_s``: the backward's device time (what
    ``tp_overlap`` hides behind); ``gemm_s``: the layer's forward GEMM time, which each backward
    GEMM pass (input gradients, weight gradients) repeats (Narayanan et al. 2021 Sec. 5.1): the
    window of each asynchronous collective (bounded by the whole layer's, not its linear's own).
    ``gather_msg_bytes``: the all-gathers' message where the stack gathers in fp8 (the output
    gradient cast to e5m2 before it: torchao's Float8RowwiseParallel; the re-gathered input is
    the forward's fp8 copy), else ``act_msg_bytes``."""
    gather_msg = act_msg_bytes if gather_msg_bytes is None else gather_msg_bytes
    # smaller messages reach less of the link's bandwidth (Calibration.comm_half_message_bytes)
    size = 1.0 + calib.comm_half_message_bytes / act_msg_bytes
    gather = parts * comms.all_gather_time(gather_msg, tp, tp_link, "tp_all_gather") * size
    scatter = parts * comms.reduce_scatter_time(act_msg_bytes, tp, tp_link, "tp_reduce_scatter") * size
    reduce = parts * comms.all_reduce_time(act_msg_bytes, tp, tp_link) * size
    regather = 0.0 * gather if calib.sp_saves_gathered_inputs else gather
    synchronous = np.where(sp, gather, 0.0)
    input_grad = np.where(sp, scatter, reduce)  # the column-parallel linear's input gradient
    regather = np.where(sp, regather, 0.0)
    total = synchronous + input_grad + regather
    if not calib.tp_backward_async:
        return TpBackward(total_s=total, exposed_s=comms.exposed(total, calib.tp_overlap, bwd_device_s))
    exposed = (comms.exposed(synchronous, calib.tp_overlap, bwd_device_s)
               + comms.exposed(input_grad, 1.0, gemm_s) + comms.exposed(regather, 1.0, gemm_s))
    return TpBackward(total_s=total, exposed_s=exposed)
