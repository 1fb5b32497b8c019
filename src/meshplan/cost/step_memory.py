"""The optimizer step's own peak: gradient copies a stack makes while it steps.

A training step's memory peaks twice: in the backward (weights, gradients, optimizer states and
the activations in flight) and in the optimizer step, after the last backward, when no
activation is alive but some stacks copy the gradients they step on. DeepSpeed's fp16 optimizers
do (Calibration.fp16_step_grad_copy_bytes_per_param, .fp16_zero_step_grad_copy_bytes_per_param):

* without ZeRO, ``FP16_Optimizer.step`` casts every fp16 gradient to fp32 and flattens them into
  one fp32 buffer while the fp16 gradients are still held: 4 + 4 bytes per parameter;
* under ZeRO 1/2, ``stage_1_and_2.py``'s step frees the gradients outside the rank's partition,
  then flattens the partition's in fp16 and casts that to fp32: 2 + 4 bytes per parameter of the
  partition, beside the partition's gradients.

The rank's peak is the larger of the two; :func:`step_excess_bytes` is what the step's peak adds
over the backward's (0 where the backward's is larger), counted with the rank's other bytes.
Arrays over plans; no branching on plan values.
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.spec.training import Precision, TrainingSpec


def copies_gradients(training: TrainingSpec, calib: Calibration) -> bool:
    """Whether the stack's optimizer step copies the gradients under this precision."""
    return training.precision == Precision.FP16 and bool(
        calib.fp16_step_grad_copy_bytes_per_param or calib.fp16_zero_step_grad_copy_bytes_per_param)


def step_extra_bytes(calib: Calibration, zero, *, rank_params, partition_params, grads_bytes,
                     grad_bytes_per_param: float):
    """Bytes the optimizer step holds beyond the backward's weights, gradients and states:
    ``rank_params`` parameters on the rank, ``partition_params`` of them in its optimizer
    partition (ZeRO 1+), ``grads_bytes`` the gradients the backward holds (fp16 training)."""
    no_zero = calib.fp16_step_grad_copy_bytes_per_param * rank_params
    # ZeRO 1/2: the partition's gradients and their copies; the others' gradients freed
    zero_partition = ((calib.fp16_zero_step_grad_copy_bytes_per_param + grad_bytes_per_param)
                      * partition_params - grads_bytes)
    return np.where(np.asarray(zero) == 0, no_zero, zero_partition)


def step_excess_bytes(training: TrainingSpec, calib: Calibration, zero, *, rank_params, partition_params,
                      grads_bytes, grad_bytes_per_param: float, activations_bytes):
    """What the optimizer step's peak adds over the backward's: max(0, step extra - activations).
    0 (a scalar) where the stack copies no gradients (most stacks, bf16 training)."""
    if not copies_gradients(training, calib):
        return 0.0
    extra = step_extra_bytes(calib, zero, rank_params=rank_params, partition_params=partition_params,
                             grads_bytes=grads_bytes, grad_bytes_per_param=grad_bytes_per_param)
    return np.maximum(extra - activations_bytes, 0.0)
