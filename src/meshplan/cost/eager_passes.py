"""Memory passes of eager model code: the device side of running a layer one aten op at a time.

cost/layer.py charges a layer's memory-bound ops one pass each, as a fused stack runs them
(Transformer Engine / Apex / torch.compile: a norm reads its input and writes its output once,
SwiGLU reads gate and up and writes one tensor). Eager PyTorch runs the same ops as the model
code writes them, each aten op a kernel that reads its inputs from HBM and writes its output back
(PyTorch 2 paper, Ansel et al. ASPLOS 2024, Sec. 1-2: eager executes op by op; TorchInductor's
gain on training comes largely from fusing such pointwise and reduction ops). The kernels are
those cost/host.py counts for an eager layer (torchtitan's llama3 model code; a stack whose
model code this is sets ``Calibration.eager_memory_passes``: meshplan's own runtime fuses its
norm forward (F.rms_norm) and shares K/V heads inside SDPA (enable_gqa), so it does not). Here
are their bytes per element beyond the one fused pass layer.py already charges, forward (the
backward runs the derivatives of the same ops: layer.py's 2x of the forward's device time).

Only the ops whose eager form differs from its fused one are counted: RMSNorm (a fp32 round
trip through 8 kernels), the rotary embedding (3 kernels per q and k through complex fp32, which
layer.py charges nothing for), GQA's repeat of K and V to every head (a copy a fused attention
kernel does not make) and SwiGLU's separate silu and multiply. LayerNorm (one aten kernel), GELU
and the residual add are one pass in both. The attention output's head merge is left out: its
copy depends on the attention call's layout (SDPA's (b, n, s, h) needs one, flash-attn's
(b, s, n, h) none). MoE blocks and Mamba mixers keep their own accounting (cost/moe.py, mixers).
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.calibration import Calibration, gpu_generation
from meshplan.cost.host import CPU_GENERATION
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.layers import Ffn, LayerKind, Mixer
from meshplan.spec.model import ModelSpec, Norm, Position

FP32_BYTES = 4.0
"""The eager norm and rotary embedding compute in fp32 (torchtitan's RMSNorm ``x.float()``,
``apply_rotary_emb``'s ``xq.float()`` viewed as complex64)."""


def _upcast(ab: float) -> float:
    """A cast to fp32 reads ab and writes 4 bytes; none when the activations are fp32 already."""
    return ab + FP32_BYTES if ab < FP32_BYTES else 0.0


def rmsnorm_extra_bytes(ab: float) -> float:
    """x.float() (ab -> 4), pow (4 -> 4), mean (reads 4), mul by rsqrt (4 -> 4), type_as (4 -> ab),
    * weight (ab -> ab); the + eps and rsqrt act on one value per token. Fused: read ab, write ab
    (layer.py's 2 elements per norm)."""
    eager = _upcast(ab) + 2 * FP32_BYTES + FP32_BYTES + 2 * FP32_BYTES + _upcast(ab) + 2 * ab
    return eager - 2 * ab


def rope_bytes(ab: float) -> float:
    """Per element of q or k: float cast (ab -> 4), complex mul by freqs_cis (4 -> 4; freqs are
    per position, shared by heads), type_as (4 -> ab). layer.py charges no rotary pass."""
    return _upcast(ab) + 2 * FP32_BYTES + _upcast(ab) if ab < FP32_BYTES else 2 * FP32_BYTES


def swiglu_extra_bytes(ab: float) -> float:
    """silu(gate) (ab -> ab), then * up (2 ab -> ab): 5 ab per element of F; layer.py's fused
    SwiGLU: 3 ab (read gate and up, write one)."""
    return 5 * ab - 3 * ab


def repeat_kv_bytes(model: ModelSpec, kind: LayerKind, *, tokens, tp, ab: float):
    """Forward bytes of GQA's repeat of K and V to every query head (torchtitan's ``repeat_kv``):
    read K (V), write it once per query head; 0 without GQA, for MLA and for layers without
    attention. The same copy whether eager or compiled (Calibration.repeat_kv_copy)."""
    if kind.mixer != Mixer.ATTENTION or model.is_mla or model.num_kv_heads >= model.num_heads:
        return 0.0 * np.asarray(tokens, dtype=float)
    return 2 * tokens * (model.kv_size / tp + model.q_size / tp) * ab


def eager_extra_bytes(model: ModelSpec, kind: LayerKind, *, tokens, tokens_replicated, tp, ab: float):
    """Forward bytes one GPU moves in an eager layer's memory-bound ops beyond layer.py's fused
    pass count, for ``tokens`` on this GPU (``tokens_replicated`` seen by the norms: T / tp under
    sequence parallel) and tensor-parallel degree ``tp`` (the heads and F are split by it)."""
    D = float(model.hidden_size)
    extra = 0.0 * np.asarray(tokens, dtype=float)
    norms = (kind.mixer != Mixer.NONE) + (kind.ffn != Ffn.NONE)
    if model.norm == Norm.RMSNORM:
        extra = extra + norms * tokens_replicated * D * rmsnorm_extra_bytes(ab)
    if kind.mixer == Mixer.ATTENTION and not model.is_mla:  # MLA's rotary part is its own
        q_width, kv_width = model.q_size / tp, model.kv_size / tp
        if model.position == Position.ROPE:
            extra = extra + tokens * (q_width + kv_width) * rope_bytes(ab)
        extra = extra + repeat_kv_bytes(model, kind, tokens=tokens, tp=tp, ab=ab)
    if kind.ffn == Ffn.DENSE and model.gated_mlp:
        extra = extra + tokens * model.ffn_hidden_size / tp * swiglu_extra_bytes(ab)
    return extra


def runs_eager(cluster: ClusterSpec, calib: Calibration) -> bool:
    """Whether the stack runs eager model code on a GPU (``Calibration.eager_memory_passes``). On a
    CPU device the elementwise probe measures the runtime's eager modules themselves
    (``Calibration.elementwise_time_factor``, meshplan.calib.layer_probe): nothing is added there."""
    return calib.eager_memory_passes and gpu_generation(cluster.gpu) != CPU_GENERATION
