"""What torch's context parallel holds per rank beyond the attention's own activations.

torch's ring attention (``torch.distributed.tensor.experimental.context_parallel``, the CP that
torchtitan applies; pytorch/pytorch torch/distributed/tensor/experimental/_attention.py@f2127db)
does not pass K/V around a ring of two buffers as Megatron-Core / Transformer Engine do:

* ``_ContextParallelOptions.rotate_method`` defaults to ``ALL_GATHER``: ``_AllGatherRotater``
  all-gathers the rank's K and V once per call and hands out chunks of the gathered buffer, so
  the whole sequence's K and V, c times the rank's, are alive for the rest of the call. The
  backward (``_templated_ring_attention_backward``) gathers them again with a rotater of its own;
* ``convert_to_f32`` defaults to True: the backward accumulates dQ, dK and dV in fp32
  (``accum_dtype``), and the dK / dV it accumulates travel the ring in fp32 through an
  ``ALL_TO_ALL`` rotater (``dkv_rotater``): the buffer being summed and the one in flight.

At the peak of one layer's attention backward a rank so holds, beyond a plain SDPA backward:
the gathered K and V, 2 x b S x h d x a bytes (S the whole sequence, a the activation bytes), and
(3 + 2 + 2) x 4 bytes per element of its own b S/c x h d: dQ, dK, dV in fp32, the fp32 dK and dV
it sends on and the ones it has received. ``h d`` is the width SDPA sees per tensor-parallel
rank: torchtitan's llama3 attention repeats K and V to every query head first (``repeat_kv``),
so h = N / t. One layer at a time (the call's buffers are freed when it returns): a transient on
top of the rank's held activations, like the rematerialised layer of cost/memory.py.
Arrays over plans; no branching on plan values.
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.arrays import CP_RING, PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.spec.layers import Mixer, layer_kind_counts
from meshplan.spec.model import ModelSpec

GATHERED_TENSORS = 2.0
"""K and V, each gathered over the whole sequence (``_AllGatherRotater``)."""
FP32_BYTES = 4.0
"""``convert_to_f32``: the backward's accumulators and its dK / dV ring in fp32."""
FP32_ACCUMULATORS = 3.0
"""dQ, dK, dV (``grad_query`` / ``grad_key`` / ``grad_value`` in ``accum_dtype``)."""
FP32_RING_BUFFERS = 4.0
"""dK and dV sent on (``torch.cat`` of the two) and received (``permute_tensor``'s output)."""


def has_attention(model: ModelSpec) -> bool:
    return any(kind.mixer == Mixer.ATTENTION for kind, _ in layer_kind_counts(model))


def torch_ring_transient_bytes(model: ModelSpec, calib: Calibration, plans: PlanArrays, *,
                               tokens_per_microbatch, tp, activation_bytes: float):
    """Bytes torch's ring attention holds per rank during one attention layer's backward, beyond
    a plain SDPA backward (the module's docstring): 0 where the stack does not run torch's CP
    (Calibration.cp_ring_gathers_kv), cp is 1, the plan's CP is all-to-all, or no layer attends.
    ``tokens_per_microbatch``: the rank's b S / c tokens."""
    if not calib.cp_ring_gathers_kv or not has_attention(model):
        return 0.0
    c = plans.cp.astype(float)
    width = model.num_heads / tp * (model.qk_head_dim + model.v_dim) / 2.0  # h d per K (or V), repeated heads
    local_elements = tokens_per_microbatch * width  # b S/c x h d
    gathered = GATHERED_TENSORS * c * local_elements * activation_bytes
    fp32 = (FP32_ACCUMULATORS + FP32_RING_BUFFERS) * FP32_BYTES * local_elements
    return np.where((c > 1) & (plans.cp_method == CP_RING), gathered + fp32, 0.0)
