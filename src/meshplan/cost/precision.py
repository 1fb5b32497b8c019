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
from meshplan.spec.cluster import ClusterSpec, GPUSpec
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


FP8_TP_GATHER_BYTES_PER_ELEMENT = 1.0
"""fp8 (e4m3 forward, e5m2 backward): one byte an element; the per-tensor scale is one scalar."""


def tp_gather_bytes_per_element(training: TrainingSpec, calib: Calibration, ab: float) -> float:
    """Bytes per element of tensor parallel's all-gathers (sequence parallel): fp8 where the
    stack casts before gathering under a tensorwise fp8 recipe (Calibration.fp8_tp_all_gather:
    torchtitan's float8 TP), else the activations' own ``ab``."""
    if (calib.fp8_tp_all_gather and training.precision == Precision.FP8
            and training.recipe == Recipe.TENSORWISE):
        return min(ab, FP8_TP_GATHER_BYTES_PER_ELEMENT)
    return ab


TENSOR_SCALED_FP8 = (Recipe.DELAYED, Recipe.TENSORWISE)
"""fp8 recipes with one scale per tensor: TE's Float8Tensor (row-wise data and its transpose)."""
FP8_COPIES_WITH_TRANSPOSE = 2.0
"""Row-wise data and transpose: what ``Calibration.fp8_weight_copy_bytes_per_param`` counts."""


def fp8_transpose_free(training: TrainingSpec, gpu: GPUSpec | None) -> bool:
    """Whether TE keeps a tensor-scaled fp8 weight without its transpose on this GPU: its
    quantizers create the transpose only where fp8 GEMMs must be TN (NVIDIA/TransformerEngine
    transformer_engine/pytorch/csrc/quantizer.cpp@ad3f651, Float8Quantizer and
    Float8CurrentScalingQuantizer ``create_tensor``: ``with_transpose = columnwise_usage &&
    !nvte_is_non_tn_fp8_gemm_supported()``); cuBLASLt takes fp8 operands in any layout from
    Blackwell on, the GPUs whose tensor cores also run block-scaled MXFP8 (GPUSpec
    .block_scaled_recipes). ROCm's TE is not read: CDNA4 counts as Blackwell here."""
    return (gpu is not None and training.precision == Precision.FP8 and training.recipe in TENSOR_SCALED_FP8
            and Recipe.MXFP8.value in gpu.block_scaled_recipes)


def weight_copy_bytes_per_param(training: TrainingSpec, calib: Calibration, gpu: GPUSpec | None = None) -> float:
    """Low-precision copies of each linear weight kept beside the bf16 weight (row-wise and the
    transposed / column-wise copy TE caches for the backward; the row-wise one alone where TE
    needs no transpose on ``gpu``: :func:`fp8_transpose_free`), 0 for bf16/fp16/fp32."""
    if training.precision == Precision.FP8:
        if fp8_transpose_free(training, gpu):
            return calib.fp8_weight_copy_bytes_per_param / FP8_COPIES_WITH_TRANSPOSE
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


def gathered_bytes_per_param(training: TrainingSpec, calib: Calibration, gpu: GPUSpec | None = None) -> float:
    """Bytes per parameter of a layer ZeRO-3 gathers: its fp8 copies where the weights are fp8
    primary weights (``--fp8-param-gather`` all-gathers them in fp8; Megatron FSDP's overrides in
    Megatron-Bridge's performance scripts drop the transpose cache, ``keep_fp8_transpose_cache
    False``, helpers.py@0132842), else the working weights."""
    if fp8_primary_weights(training, calib) and calib.fp8_weight_copy_bytes_per_param:
        return weight_copy_bytes_per_param(training, calib, gpu)
    return calib.weight_bytes_per_param
