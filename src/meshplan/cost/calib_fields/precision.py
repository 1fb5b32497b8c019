"""Precision-per-operation factors of :class:`~meshplan.cost.calibration.Calibration`
(read by cost/precision.py): fp8/fp4 GEMM rates, casts, low-precision copies.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrecisionFields"]


@dataclass(frozen=True, kw_only=True)
class PrecisionFields:
    """fp8/fp4 GEMM rates, casts and the low-precision copies a stack keeps."""

    fp8_matmul_factor: float = 0.85
    """Fraction of the fp8 peak an fp8 GEMM reaches, over the fraction a bf16 GEMM of the same
    shape reaches of the bf16 peak: cuBLASLt fp8 GEMMs on H100 sustain ~1.6-1.8x, not 2x, the
    bf16 rate on large shapes (NVIDIA Transformer Engine performance notes; scaling and amax
    epilogues). Literature default; fitted per stack (calib/fit.py)."""
    fp4_matmul_factor: float = 0.75
    """The same for NVFP4/MXFP4 GEMMs over the fp4 peak (Blackwell fp4 GEMMs reach ~1.5x the fp8
    rate on training shapes rather than 2x: block-scale loads, NVIDIA 2025 NVFP4 pretraining
    report). Literature default; fitted per stack."""
    fp8_attention: bool = False
    """The attention core runs in fp8 (Megatron --fp8-dot-product-attention, cuDNN fp8 fused
    attention); off by default in Megatron-Core and the Megatron-Bridge recipes: bf16 core."""
    fp4_bf16_edge_layers: float = 2.0
    """Layers an fp4 recipe keeps in bf16: Megatron --first-last-layers-bf16 with its defaults
    --num-layers-at-start-in-bf16 1 and --num-layers-at-end-in-bf16 1 (NVIDIA 2025, 'Pretraining
    LLMs with NVFP4', Sec. 4: the last layers are the sensitive ones)."""
    lowp_cast_bytes_per_element: float = 4.0
    """HBM bytes per element of an fp8/fp4 GEMM input for its cast, amax and transpose: bf16 read
    (2) + row-wise and column-wise low-precision copies written (1 + 1), TE's fused
    cast_transpose kernel. Charged on activation inputs (forward) and output gradients
    (backward); weights are cast once per step and cached across micro-batches."""
    fp8_saved_input_bytes_per_element: float = 1.0
    """Bytes per element of a linear's input saved for its backward under fp8: TE keeps the fp8
    (column-wise) copy it made for the weight-gradient GEMM, not the bf16 tensor."""
    fp4_saved_input_bytes_per_element: float = 0.5625
    """The same under NVFP4: 4-bit values plus one 1-byte E4M3 scale per 16 elements."""
    fp8_weight_copy_bytes_per_param: float = 2.0
    """fp8 copies of each linear weight kept beside the bf16 weight: row-wise and the transposed
    copy TE caches for the backward (Float8Tensor transpose cache; MXFP8 keeps row- and
    column-wise data the same way). Tensor-scaled fp8 on Blackwell keeps the row-wise copy
    alone, half of this (cost/precision.py ``fp8_transpose_free``)."""
    fp4_weight_copy_bytes_per_param: float = 1.125
    """NVFP4 row- and column-wise weight copies: 2 x (0.5 + 1/16 scale) bytes per parameter."""
    fp8_param_gather: bool = False
    """fp8 primary weights: the layers' linear weights live only as their fp8 copies (no bf16
    working copy beside them; the fp32 master stays in the optimizer), Megatron-Core
    ``--fp8-param-gather`` (TE ``fp8_model_init``). Megatron-Bridge's fp8 mixed-precision
    recipes set it for delayed, tensorwise (current scaling) and mxfp8, not for blockwise
    (subchannel) scaling (src/megatron/bridge/training/mixed_precision.py@0509780:
    bf16_with_fp8_current_scaling_mixed / bf16_with_mxfp8_mixed ``fp8_param_gather = True``,
    bf16_with_fp8_subchannel_scaling_mixed False). A stack field (frameworks.json)."""
    fp8_tp_all_gather: bool = False
    """Tensor parallel's all-gathers move fp8 (1 byte an element) under a tensorwise fp8 recipe
    with sequence parallel: the forward's all-gather of a column-parallel linear's input runs
    after its cast to fp8 and the backward's all-gather of a row-parallel linear's output
    gradient after its cast to fp8 (e5m2); the reduce-scatters stay bf16 (the GEMMs' outputs).
    torchtitan applies torchao's Float8ColwiseParallel / Float8RowwiseParallel /
    PrepareFloat8ModuleInput whenever Float8 is on with a tensorwise recipe and TP is used
    (torchtitan/models/llama3/infra/parallelize.py, ``enable_float8_tensorwise_tp = enable_float8_linear
    and not float8_is_rowwise``: "float8 all-gather with TP is only supported for tensorwise
    float8 scaling recipes. For rowwise recipes, we use regular TP and all-gather happens in high
    precision"; torchtitan docs/float8.md: "we support float8 all-gather for FSDP (optional) and
    for TP (by default for ``Float8Linear``)"). FSDP's float8 weight all-gather is opt-in
    (``float8.enable_fsdp_float8_all_gather``, default False) and not assumed. A stack field
    (frameworks.json); cost/precision.py ``tp_gather_bytes_per_element``."""
