"""Memory passes of a MoE block's experts that run as separate eager ops, outside the fused kernels
cost/moe.py and cost/layer.py count: the routed experts' output bias, and a clamped gated
activation's clamp. Both are properties of the architecture (biased experts, a clamped GLU: GPT-OSS)
as Megatron-Core's TEGroupedMLP runs it; a fused grouped MLP (``Calibration.moe_fused_grouped_mlp``)
takes neither path.

Megatron-Core's TEGroupedMLP (megatron/core/transformer/moe/experts.py, ``forward`` and
``_apply_bias``, read in the code corpus's Megatron-Core copies of the GPT-OSS era; the stored
NVIDIA/Megatron-LM history holds only older versions of the file, so no commit is pinned here):

* **Expert output bias.** ``linear_fc2`` is built with ``skip_bias_add=True`` and the bias is added
  after the grouped GEMM by ``_apply_bias``: the output is split per local expert and each part
  becomes ``t + b * p`` (the expert's bias scaled by the routed probability), then ``torch.cat``
  and ``.to(dtype)``: three kernels per element of the (routed copies x D) output, in the
  activation dtype (the router's probabilities take the logits' dtype, Megatron-Core
  ``topk_softmax_with_capacity``; ``.to`` is then a no-op). Forward per element: ``b * p`` writes
  one (b and p are per row / per column), the add reads two and writes one, the cat reads one and
  writes one: 6 elements. Backward: the cat's and the add's gradients are views; the mul's
  gradients are two reductions, ``(g * p).sum(0)`` for the bias and ``(g * b).sum(-1)`` for the
  probability, each a mul (read one, write one) and a sum (read one): 6 elements.
  The first linear's bias runs inside TE's grouped GEMM (``skip_bias_add=False``: the cuBLASLt bias
  epilogue) and is not counted.
* **Clamped GLU.** ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py,
  NVIDIA/Megatron-LM@1fb2a0c) clamps the gate and the linear half and concatenates them again
  *before* the jit-fused activation (``x_glu.clamp(...)``, ``x_linear.clamp(...)``, ``torch.cat``):
  per element of the (routed copies x 2F) fc1 output, the clamps read one and write one, the cat
  reads one and writes one: 4 elements forward. Backward: the cat's gradient is a view; each
  clamp's gradient reads the input and the gradient and writes one (3); the chunk's gradient
  concatenates the two halves again (2): 5 elements. The fused activation itself is the one pass
  cost/layer.py already counts.

Bytes here are per GPU and per micro-batch, forward and backward apart: cost/layer.py runs the
backward of its memory-bound ops at 2x the forward, which these passes do not follow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.spec.model import ModelSpec

BIAS_FWD_ELEMENTS = 6.0
"""Elements moved per element of the experts' output by ``_apply_bias`` forward (module docstring)."""
BIAS_BWD_ELEMENTS = 6.0
"""Its backward: the bias and probability gradients' mul + sum each."""
CLAMP_FWD_ELEMENTS = 4.0
"""Elements moved per element of the fc1 output by the clamps and the cat forward."""
CLAMP_BWD_ELEMENTS = 5.0
"""Their backward: clamp gradients (3) and the chunk's concatenation (2)."""


@dataclass(frozen=True)
class ExpertPassBytes:
    """HBM bytes of the eager expert passes on one GPU, one micro-batch."""

    fwd_bytes: np.ndarray
    bwd_bytes: np.ndarray


def expert_pass_bytes(model: ModelSpec, *, copies, fc1_width: float, out_width: float, ab: float,
                      fused_mlp: bool) -> ExpertPassBytes:
    """Bytes of the output-bias and clamp passes for ``copies`` routed token copies on this GPU,
    the experts' fc1 output ``fc1_width`` wide (2F / etp for a GLU) and their output ``out_width``
    wide; none without biased experts or a clamped GLU, or under one fused grouped MLP kernel."""
    copies = np.asarray(copies, dtype=float)
    zero = 0.0 * copies
    if fused_mlp:
        return ExpertPassBytes(zero, zero)
    fwd, bwd = zero, zero
    if model.mlp_bias:
        fwd = fwd + copies * out_width * ab * BIAS_FWD_ELEMENTS
        bwd = bwd + copies * out_width * ab * BIAS_BWD_ELEMENTS
    if model.gated_mlp and model.glu_clamp_limit > 0:
        fwd = fwd + copies * fc1_width * ab * CLAMP_FWD_ELEMENTS
        bwd = bwd + copies * fc1_width * ab * CLAMP_BWD_ELEMENTS
    return ExpertPassBytes(fwd, bwd)


def clamp_rerun_elements(model: ModelSpec, *, fused_mlp: bool) -> float:
    """Elements the clamps and the cat move forward per element of the experts' F-wide activation
    (the fc1 output is 2F wide): what Megatron's ``moe_act`` recompute reruns with the activation
    (the clamp sits inside TEGroupedMLP's checkpointed ``bias_act_func``)."""
    if fused_mlp or not (model.gated_mlp and model.glu_clamp_limit > 0):
        return 0.0
    return 2.0 * CLAMP_FWD_ELEMENTS
