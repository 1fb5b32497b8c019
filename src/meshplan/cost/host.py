"""Host-bound layers: the host issues a layer's kernels one at a time, the device runs them.

A PyTorch stack without CUDA graphs launches every kernel of a layer from Python: each op costs
the host its Python frame, the dispatcher and ``cudaLaunchKernel`` (several us: PyTorch blog
'Accelerating PyTorch with CUDA Graphs', 2021), while the device runs the queue asynchronously
(PyTorch CUDA semantics, 'Asynchronous execution'). The host runs ahead as long as the device is
busier; when a layer's kernels are small (a narrow model, a small micro-batch, a fast GPU) the
device waits for the host instead. A layer then takes

    max(device time, kernels x host time per kernel)

forward and backward alike: the form of the MoE block's launch bound (cost/layer.py,
``Calibration.moe_alltoall_sync_s``), here for every layer. On an A100 a 1B-parameter layer at a
few thousand tokens is device-bound; on an H100 (3x the bf16 peak) the same layer may not be.

Kernels are counted from the layer's structure (norms, projections, rotary embedding, the
attention core, the MLP, residual adds) as eager PyTorch runs them (one kernel per aten op of
the model code: torchtitan's llama3 model, meshplan's runtime models) or as a fused stack does
(Megatron-Core with Transformer Engine, torch.compile: norm, rotary, activation and residual as
one kernel each, Q/K/V and gate/up as one GEMM), plus the per-layer launches of the stack's
parallelism (FSDP2's all-gather and reduce-scatter with their copy-in/copy-out, TP collectives).
The host time per kernel is a stack field (``Calibration.host_s_per_kernel``, 0: not modelled);
under a full-iteration CUDA graph (``Calibration.cuda_graph_full_iteration``, set by a stack
release's presets: spec/stack_version.py) one graph launch replaces every layer's launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration, gpu_generation
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.layers import Ffn, LayerKind, Mixer
from meshplan.spec.model import ModelSpec, Norm, Position
from meshplan.spec.training import MoeDispatcher, Precision, Recipe, TrainingSpec


@dataclass(frozen=True)
class OpKernels:
    """Forward kernels of one op, in eager PyTorch and in a fused stack."""

    eager: int
    fused: int
    source: str

    def count(self, fused: bool) -> int:
        return self.fused if fused else self.eager


RMSNORM = OpKernels(8, 1, "eager: x.float(), pow, mean, + eps, rsqrt, mul, type_as, * weight (torchtitan "
                          "RMSNorm before torch 2.4's fused F.rms_norm); fused: TE / Apex / Inductor, one kernel")
LAYERNORM = OpKernels(1, 1, "aten native_layer_norm is one kernel in eager and fused stacks alike")
ROPE_PER_TENSOR = OpKernels(3, 1, "eager: float cast to complex, complex mul by freqs_cis, type_as "
                                  "(torchtitan apply_rotary_emb), for q and for k; fused: TE fused RoPE")
GQA_REPEAT = OpKernels(1, 0, "eager repeat_kv: expand + reshape copies K and V to N heads (torchtitan); fused "
                             "attention kernels read grouped heads directly")
HEAD_MERGE = OpKernels(1, 0, "eager: (b, n, s, h) -> (b, s, n*h) transpose + contiguous copy; fused: the "
                             "kernel writes (b, s, n*h)")
ATTENTION_CORE = OpKernels(1, 1, "one fused attention (flash / cuDNN) kernel")
GATE_MUL = OpKernels(1, 0, "eager SwiGLU: silu(w1 x) * (w3 x) is two kernels; fused: one swiglu kernel")
ACTIVATION = OpKernels(1, 1, "the activation (silu / gelu)")
RESIDUAL = OpKernels(1, 1, "the residual add (Megatron: fused bias-dropout-add)")
SSD_SCAN = OpKernels(5, 5, "Mamba-2 chunked scan: chunk cumsum, chunk state, state passing, BMM, chunk scan "
                           "(Dao & Gu 2024 Sec. 6-7 Triton kernels)")
CONV1D = OpKernels(1, 1, "Mamba's causal depthwise conv1d")

BACKWARD_KERNELS_PER_FORWARD = 2.0
"""Backward kernels per forward kernel: a GEMM's backward is two GEMMs (input and weight
gradients) and an elementwise op's backward one or two kernels (autograd's derivatives.yaml),
the same 2x as the FLOPs (Narayanan et al. 2021 Sec. 5.1)."""

CPU_GENERATION = "cpu"
"""The generation of a CPU device (calibration_fitted.json 'generations'): host and device are one."""

FSDP_GATHER_KERNELS = 3
"""FSDP2's per-layer parameter all-gather: copy-in into the flat buffer, the all-gather, the
copy-out into the unsharded parameters (torchtitan docs fsdp.md; FSDP2 foreach_all_gather)."""
FSDP_REDUCE_KERNELS = 3
"""FSDP2's per-layer gradient reduce-scatter: copy-in (chunk_cat), reduce-scatter, copy-out."""

# ---- kernels a layer's ops add beyond its math (Calibration.host_kernels_by_op) ---------------
QUANTIZE_KERNELS_PER_TENSOR = MappingProxyType({
    # TE's fused cast_transpose takes the amax in the cast (the scale comes from the history)
    Recipe.DELAYED: 1,
    # current scaling: an amax kernel, the scale, then the cast (TransformerEngine
    # transformer_engine/pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl @006b3360)
    Recipe.TENSORWISE: 3,
    Recipe.ROWWISE: 2,  # torchao rowwise: the row amax, then the scaled cast
    Recipe.BLOCKWISE: 1,  # TE Float8BlockScaling: one block-quantize kernel, scales inside
    Recipe.MXFP8: 1,  # TE MXFP8Quantizer: row- and column-wise E8M0 blocks in one kernel
    # NVFP4's two-level scale needs the tensor's amax before the block cast, and the wgrad
    # operands go through the random Hadamard transform first (TE docs 'NVFP4'; NVIDIA 2025,
    # 'Pretraining LLMs with NVFP4' Sec. 4; transformer_engine/common/hadamard_transform/)
    Recipe.NVFP4: 3,
    Recipe.MXFP4: 1,
})
"""Kernels to quantize one GEMM operand per recipe: the forward quantizes each low-precision
GEMM's input, the backward its output gradient (weights are cast once per step, TE
``is_first_microbatch``)."""
MOE_BLOCK_KERNELS = 13
"""Forward kernels of a Megatron-Core MoE block beyond its router GEMM (counted in ffn_kernels),
a grouped-GEMM expert MLP behind the all-to-all dispatcher: top-k with its softmax (fused) and
the load-balancing loss (2), the dispatcher's token counts and splits (2), permute (1), the
dispatch all-to-all (1), the sort of the received chunks by local expert (1), fc1, activation,
fc2 (3), the sort back (1), the combine all-to-all (1), unpermute (1). NVIDIA/Megatron-LM
megatron/core/transformer/moe/{router.py, token_dispatcher.py MoEAlltoAllTokenDispatcher,
moe_utils.py permute / sort_chunks_by_idxs / unpermute, experts.py TEGroupedMLP}."""
SHARED_EXPERT_KERNELS = 3
"""A shared expert's fc1, activation, fc2 (megatron/core/transformer/moe/shared_experts.py)."""


@dataclass(frozen=True)
class LayerKernels:
    """Kernels one layer launches for one micro-batch on one GPU."""

    fwd: np.ndarray
    bwd: np.ndarray


def _norm(model: ModelSpec) -> OpKernels:
    return RMSNORM if model.norm == Norm.RMSNORM else LAYERNORM


def mixer_kernels(model: ModelSpec, kind: LayerKind, fused: bool) -> int:
    """Forward kernels of the token-mixer sub-block: pre-norm, projections, core, residual."""
    if kind.mixer == Mixer.NONE:
        return 0
    norm, res = _norm(model).count(fused), RESIDUAL.count(fused)
    if kind.mixer == Mixer.MAMBA:  # in_proj, conv1d, the scan, gated norm, out_proj
        return norm + 1 + CONV1D.count(fused) + SSD_SCAN.count(fused) + _norm(model).count(fused) + 1 + res
    gemms = 2 if fused else 4  # fused QKV + proj, or q, k, v, o
    rope = 2 * ROPE_PER_TENSOR.count(fused) if model.position == Position.ROPE else 0
    gqa = 2 * GQA_REPEAT.count(fused) if model.num_kv_heads < model.num_heads else 0
    return norm + gemms + rope + gqa + ATTENTION_CORE.count(fused) + HEAD_MERGE.count(fused) + res


def ffn_kernels(model: ModelSpec, kind: LayerKind, fused: bool) -> int:
    """Forward kernels of the channel-mixer sub-block. A MoE block counts its pre-norm, router
    GEMM and residual only: its own launches are the MoE block's bound (cost/moe.py)."""
    if kind.ffn == Ffn.NONE:
        return 0
    norm, res = _norm(model).count(fused), RESIDUAL.count(fused)
    if kind.ffn == Ffn.MOE:
        return norm + 1 + res
    if model.gated_mlp:
        gemms = 2 if fused else 3  # gate+up as one GEMM, then down; or w1, w3, w2
        return norm + gemms + ACTIVATION.count(fused) + GATE_MUL.count(fused) + res
    return norm + 2 + ACTIVATION.count(fused) + res


def low_precision_gemms(model: ModelSpec, kind: LayerKind) -> int:
    """Linear GEMMs of one layer forward that run in fp8 / fp4 in a fused stack (cost/precision.py:
    the router and the attention core stay in bf16): QKV and output projections (MLA: q down/up,
    kv down/up, output), Mamba's in/out projections, fc1 / fc2 of the MLP, of the grouped experts
    and of a shared expert."""
    if kind.mixer == Mixer.ATTENTION:
        mixer = 5 if model.kv_lora_rank else 2
    elif kind.mixer == Mixer.MAMBA:
        mixer = 2
    else:
        mixer = 0
    ffn = 0 if kind.ffn == Ffn.NONE else 2
    if kind.ffn == Ffn.MOE and model.moe_shared_experts:
        ffn += 2
    return mixer + ffn


def op_kernels(model: ModelSpec, kind: LayerKind, training: TrainingSpec | None,
               calib: Calibration) -> tuple[float, float]:
    """(forward, backward) kernels a layer's ops add beyond the counts of mixer_kernels and
    ffn_kernels (``Calibration.host_kernels_by_op``): the quantize kernels of each low-precision
    GEMM (the input forward, the output gradient backward) and the MoE block's router, dispatcher
    and expert kernels (its backward, like its math, 2x)."""
    if not calib.host_kernels_by_op or training is None:
        return 0.0, 0.0
    quant = 0.0
    if training.precision in (Precision.FP8, Precision.FP4) and training.recipe is not None:
        quant = float(QUANTIZE_KERNELS_PER_TENSOR[training.recipe] * low_precision_gemms(model, kind))
    moe = 0.0
    # where the dropless all-to-all's host sync is charged, its time already stands for the
    # block's launches after the sync (Calibration.moe_alltoall_sync_s): not counted twice
    if kind.ffn == Ffn.MOE and not moe_sync_charged(training, calib):
        moe = float(MOE_BLOCK_KERNELS + (SHARED_EXPERT_KERNELS if model.moe_shared_experts else 0))
    return quant + moe, quant + BACKWARD_KERNELS_PER_FORWARD * moe


def moe_sync_charged(training: TrainingSpec, calib: Calibration) -> bool:
    """A MoE layer pays the dropless all-to-all's host sync (cost/layer.py): a dispatcher that
    moves the token counts to the host (Megatron-Core's alltoall; the flex one where
    ``Calibration.moe_flex_host_sync``), a dropless run (a token-drop run is padded to capacity:
    fixed splits, Megatron-Core's cuda_sync_point 'no_sync'), no full-iteration CUDA graph."""
    syncs = training.moe_dispatcher == MoeDispatcher.ALLTOALL or (
        training.moe_dispatcher == MoeDispatcher.FLEX and calib.moe_flex_host_sync)
    return bool(calib.moe_alltoall_sync_s and training.moe_capacity_factor is None
                and syncs and not calib.cuda_graph_full_iteration)


def layer_kernels(model: ModelSpec, kind: LayerKind, plans: PlanArrays, calib: Calibration,
                  training: TrainingSpec | None = None) -> LayerKernels:
    """Forward and backward kernels of one layer (module docstring), with the per-layer launches
    of tensor parallelism (one collective per f/g, two with sequence parallel: Korthikanti et al.
    2022 Sec. 4.2.2), of ZeRO-2/3 (FSDP2's gather forward and backward, reduce backward) and,
    given the training spec, those its ops add (op_kernels)."""
    fused = calib.host_fused_kernels
    extra_fwd, extra_bwd = op_kernels(model, kind, training, calib)
    math = float(mixer_kernels(model, kind, fused) + ffn_kernels(model, kind, fused))
    tp_calls = np.where(plans.tp > 1, np.where(plans.sp, 2.0, 1.0) * kind.parts, 0.0)
    shards = plans.dp_shard * plans.cp
    gather = np.where((plans.zero >= 3) & (shards > 1), FSDP_GATHER_KERNELS, 0.0)
    reduce = np.where((plans.zero >= 2) & (shards > 1), FSDP_REDUCE_KERNELS, 0.0)
    fwd = math + extra_fwd + tp_calls + gather
    bwd = BACKWARD_KERNELS_PER_FORWARD * math + extra_bwd + tp_calls + gather + reduce
    return LayerKernels(fwd=fwd, bwd=bwd)


def host_runs_apart(cluster: ClusterSpec) -> bool:
    """The host issues work to a device that runs it asynchronously (any GPU); on a CPU device
    host and device are one, and host time is device time."""
    return gpu_generation(cluster.gpu) != CPU_GENERATION


def host_bound(device_s, host_s):
    """The layer's time when host and device run concurrently: the slower sets the pace."""
    return np.maximum(device_s, host_s)


def host_launch_s(model: ModelSpec, cluster: ClusterSpec, kind: LayerKind, plans: PlanArrays,
                  calib: Calibration, training: TrainingSpec | None = None) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(forward, backward) host time to launch one layer's kernels for one micro-batch; 0 when
    the stack has no per-kernel host cost, under a full-iteration CUDA graph
    (``Calibration.cuda_graph_full_iteration``: one graph launch per step), and on a CPU
    device, where host and device are one and the dispatch time is already device time (``Calibration.layer_overhead_s``, measured)."""
    if not calib.host_s_per_kernel or calib.cuda_graph_full_iteration or not host_runs_apart(cluster):
        return 0.0, 0.0  # a replayed CUDA graph issues the layer's kernels without the host
    k = layer_kernels(model, kind, plans, calib, training)
    return k.fwd * calib.host_s_per_kernel, k.bwd * calib.host_s_per_kernel
