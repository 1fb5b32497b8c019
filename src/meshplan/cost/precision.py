"""Precision per operation: which GEMMs of a layer run in fp8 / fp4, at which rate, and what the
low-precision path costs around them (casts, amax, transposes, weight copies, saved inputs).

Transformer Engine / Megatron-Core under ``fp8_autocast`` (TE "Using FP8 with Transformer
Engine"; Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 4):

* the linear layers (QKV, output projection, fc1, fc2, the experts' grouped GEMMs, MLA's up and
  down projections, Mamba's in/out projections) run in the low precision;
* the attention core (QK^T, softmax, AV) stays in bf16 unless an fp8 attention is chosen
  (Megatron ``--fp8-dot-product-attention``, off by default: ``Calibration.fp8_attention``);
* the LM head, the embedding and the MoE router stay in bf16 (TE's fp8 modules are the
  transformer layers' linears; Megatron's output layer and router are plain bf16 GEMMs);
* fp4 (NVFP4) recipes keep the first and last layers in bf16 (NVIDIA 2025, "Pretraining Large
  Language Models with NVFP4", Sec. 4; Megatron ``--first-last-layers-bf16``):
  ``Calibration.fp4_bf16_edge_layers``.

Every low-precision GEMM input is cast (bf16 read, fp8/fp4 written row-wise and, for the
backward's transposed GEMMs, column-wise) with its amax taken in the same fused kernel (TE
``cast_transpose``): memory-bound work of ``lowp_cast_bytes_per_element`` HBM bytes per element
of the activation input (forward) and of the output gradient (backward). Weights are cast once
per step and cached over micro-batches (TE ``is_first_microbatch``): not charged per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.calibration import Calibration
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.training import Precision, Recipe, TrainingSpec

LOW_PRECISIONS = (Precision.FP8, Precision.FP4)


@dataclass(frozen=True)
class OpRates:
    """FLOP/s (peak x clock x low-precision factor) per class of operation, and the cast cost."""

    linear_flops: float
    """C of the layers' linear GEMMs: the training precision's peak, times
    ``fp8_matmul_factor`` / ``fp4_matmul_factor`` for a low precision."""
    core_flops: float
    """C of the attention core / SSD scan: bf16 peak, or the fp8 linear rate with fp8 attention."""
    bf16_flops: float
    """C of what always stays in the compute dtype: LM head, router."""
    cast_bytes_per_element: float
    """HBM bytes of casts + amax + transposes per element of a low-precision GEMM input (0 for
    bf16/fp16/fp32)."""
    low_precision: bool


def compute_dtype_peak_flops(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Peak of the compute dtype beside the fp8/fp4 GEMMs (bf16; fp16/fp32 runs use their own)."""
    if training.precision in LOW_PRECISIONS:
        return cluster.gpu.peak_flops(Precision.BF16) * cluster.clock_fraction
    return cluster.compute_peak_flops(training)


def op_rates(cluster: ClusterSpec, training: TrainingSpec, calib: Calibration) -> OpRates:
    """The rates of each class of operation for this precision and recipe (module docstring)."""
    peak = cluster.compute_peak_flops(training)  # checks the recipe runs on this GPU
    bf16 = compute_dtype_peak_flops(cluster, training)
    if training.precision not in LOW_PRECISIONS:
        return OpRates(linear_flops=peak, core_flops=peak, bf16_flops=peak,
                       cast_bytes_per_element=0.0, low_precision=False)
    factor = calib.fp8_matmul_factor if training.precision == Precision.FP8 else calib.fp4_matmul_factor
    linear = peak * factor
    fp8_core = calib.fp8_attention and cluster.gpu.peak_fp8_flops > 0
    core = cluster.gpu.peak_flops(Precision.FP8) * cluster.clock_fraction * calib.fp8_matmul_factor if fp8_core else bf16
    return OpRates(linear_flops=linear, core_flops=core, bf16_flops=bf16,
                   cast_bytes_per_element=calib.lowp_cast_bytes_per_element, low_precision=True)


def bf16_layer_fraction(training: TrainingSpec, calib: Calibration, num_layers: int) -> float:
    """Fraction of the layers that an fp4 recipe keeps in bf16 (first and last ones)."""
    if training.precision != Precision.FP4 or num_layers < 1:
        return 0.0
    return min(calib.fp4_bf16_edge_layers, float(num_layers)) / num_layers


def saved_input_bytes(training: TrainingSpec, calib: Calibration, ab: float) -> float:
    """Bytes per element of a linear's input kept for its backward: TE saves the low-precision
    (column-wise) copy it already made for the weight-gradient GEMM instead of the bf16 tensor
    (TE Linear/LayerNormLinear ``save_for_backward`` of the quantized input)."""
    if training.precision == Precision.FP8:
        return min(ab, calib.fp8_saved_input_bytes_per_element)
    if training.precision == Precision.FP4:
        return min(ab, calib.fp4_saved_input_bytes_per_element)
    return ab


def weight_copy_bytes_per_param(training: TrainingSpec, calib: Calibration) -> float:
    """Low-precision copies of each linear weight kept beside the bf16 weight (row-wise and the
    transposed / column-wise copy TE caches for the backward), 0 for bf16/fp16/fp32."""
    if training.precision == Precision.FP8:
        return calib.fp8_weight_copy_bytes_per_param
    if training.precision == Precision.FP4:
        return calib.fp4_weight_copy_bytes_per_param
    return 0.0


FP8_PARAM_GATHER_RECIPES = (Recipe.DELAYED, Recipe.TENSORWISE, Recipe.MXFP8)
"""The fp8 recipes whose Megatron-Bridge mixed-precision config keeps fp8 primary weights
(``fp8_param_gather``; blockwise scaling does not: Calibration.fp8_param_gather)."""


def fp8_primary_weights(training: TrainingSpec, calib: Calibration) -> bool:
    """Whether the layers' linear weights are held only as their fp8 copies (no bf16 weight)."""
    return (calib.fp8_param_gather and training.precision == Precision.FP8
            and training.recipe in FP8_PARAM_GATHER_RECIPES)
