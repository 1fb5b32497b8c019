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

meshplan's own ring (runtime/ring_attention.py) passes K/V chunks point to point, as Megatron-Core
does, but computes each block in eager torch, in query-row tiles of fp32 scores
(Calibration.cp_ring_score_tile_rows; meshplan/ring_policy.py). Its backward holds
``cp_ring_backward_live_tiles`` tiles of (b, N/t, rows, S/c) fp32, beside dO upcast to fp32, dQ
summed over the blocks and this block's dQ (3 fp32 tensors of the rank's queries), the dK / dV it
sums and the block's own (4 fp32 of its K/V heads), and the K/V block it received (2 in the compute
dtype): :func:`eager_ring_transient_bytes`. The README plan (llama3-70b, tp 2, cp 2, 8,192
tokens): 2 x 32 x 1,024 x 4,096 x 4 B = 1 GiB of tiles, 0.22 GiB of the rest.
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
EAGER_RING_FP32_QUERY_TENSORS = 3.0
"""meshplan's ring backward: dO upcast to fp32, dQ summed over the blocks, this block's dQ."""
EAGER_RING_FP32_KV_TENSORS = 4.0
"""meshplan's ring backward: the travelling block's dK and dV sums and this block's dK and dV, fp32."""
EAGER_RING_RECEIVED_KV_TENSORS = 2.0
"""meshplan's ring backward: the K and V block received from the previous rank (compute dtype)."""
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


def eager_ring_transient_bytes(model: ModelSpec, calib: Calibration, plans: PlanArrays, *,
                               tokens_per_microbatch, seq_len: float, tp, activation_bytes: float):
    """Bytes meshplan's eager ring attention holds per rank during one attention layer's backward
    beyond the layer's activations (the module's docstring): 0 where the stack's ring is a fused
    kernel (Calibration.cp_ring_score_tile_rows 0), cp is 1, the plan's CP is all-to-all, or no
    layer attends. ``tokens_per_microbatch``: the rank's b S / c tokens; ``seq_len``: S."""
    if not calib.cp_ring_score_tile_rows or not has_attention(model):
        return 0.0
    c = plans.cp.astype(float)
    local_seq = seq_len / c  # keys of a block, queries of the rank
    heads = model.num_heads / tp
    tiles = (calib.cp_ring_backward_live_tiles * tokens_per_microbatch / local_seq * heads
             * np.minimum(calib.cp_ring_score_tile_rows, local_seq) * local_seq * FP32_BYTES)
    queries = EAGER_RING_FP32_QUERY_TENSORS * tokens_per_microbatch * heads * model.qk_head_dim * FP32_BYTES
    kv_width = np.maximum(model.num_kv_heads / tp, 1.0) * (model.qk_head_dim + model.v_dim) / 2.0  # K or V a token
    kv = tokens_per_microbatch * kv_width * (EAGER_RING_FP32_KV_TENSORS * FP32_BYTES
                                             + EAGER_RING_RECEIVED_KV_TENSORS * activation_bytes)
    return np.where((c > 1) & (plans.cp_method == CP_RING), tiles + queries + kv, 0.0)
