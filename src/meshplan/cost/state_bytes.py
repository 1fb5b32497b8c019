"""Bytes per activation element and per parameter on one GPU: the activations' dtype, the
weights, gradients and optimizer state under ZeRO (moved out of cost/layer.py, unchanged)."""

from __future__ import annotations

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.spec.training import Optimizer, Precision, TrainingSpec


def activation_bytes(precision: Precision) -> float:
    """Bytes of one activation / activation-gradient element for this training precision.

    fp32 training keeps 4-byte activations; bf16/fp16 (mixed precision) keep 2. fp8 keeps 2 as
    well: Transformer Engine's fp8_autocast (what Megatron-LM's --fp8-format uses) runs only the
    GEMMs in FP8, casting their inputs inside each module, while the tensors passed between
    modules, the residual stream, the attention core and the TP/CP/PP/EP collectives stay in the
    bf16 compute dtype (TE "Using FP8 with Transformer Engine"; Micikevicius et al. 2022 Sec. 4).
    The inputs a linear saves for its backward are its fp8 copies (cost/precision.saved_input_bytes).
    """
    return 4.0 if precision == Precision.FP32 else 2.0


def optimizer_state_bytes_per_param(calib: Calibration, training: TrainingSpec) -> float:
    """fp32 master weights + optimizer moments (Adam 2, SGD 1); the moments only where the
    parameter is the master (Calibration.params_are_master: counted as the weights)."""
    moments = calib.sgd_bytes_per_param if training.optimizer == Optimizer.SGD else calib.adam_bytes_per_param
    return moments if calib.params_are_master else calib.master_bytes_per_param + moments


def param_bytes_per_param(calib: Calibration) -> float:
    """Bytes of the parameter a rank keeps (sharded under ZeRO-3): the low-precision working
    copy, or the fp32 master itself where the stack keeps no other (Calibration.params_are_master:
    torch FSDP's fp32 sharded parameter)."""
    return calib.master_bytes_per_param if calib.params_are_master else calib.weight_bytes_per_param


def state_bytes(calib: Calibration, training: TrainingSpec, params, zero, shard):
    """Weights + grads + optimizer of ``params`` on one GPU, ZeRO stage ``zero`` over ``shard``
    ranks (Rajbhandari et al. 2020 Sec. 5: stage 1 optimizer, 2 + gradients, 3 + weights)."""
    opt = optimizer_state_bytes_per_param(calib, training)
    w = param_bytes_per_param(calib) / np.where(zero >= 3, shard, 1)
    g = calib.grad_bytes_per_param(training.precision) / np.where(zero >= 2, shard, 1)
    o = opt / np.where(zero >= 1, shard, 1)
    return params * (w + g + o)
