"""Time of torch's context parallel (the ring attention torchtitan applies) as it runs.

pytorch/pytorch torch/distributed/tensor/experimental/_attention.py@f2127db
(``_templated_ring_attention`` and ``_templated_ring_attention_backward``; the defaults of
``_ContextParallelOptions``: ``enable_load_balance``, ``rotate_method`` ALL_GATHER,
``convert_to_f32``). Per attention layer on a rank of the c-way CP group, with b S/c local
tokens held as two round-robin chunks (i and 2c-1-i) and h = N/t heads (torchtitan repeats K/V to
every query head before SDPA):

* **Blocks.** Step 0 is one causal SDPA call on the local (S/c x S/c) block. Each later step
  i = 1..c-1 is one non-causal call on half a block: for i <= rank the full local Q against the
  first chunk of the received K/V (S/c x S/2c), for i > rank the second Q chunk against the whole
  received K/V (S/2c x S/c); no step is skipped. The work is the causal half of S x S spread
  evenly; rank c-1 runs every later step as S/c queries against S/2c keys, the shortest KV of
  any call, so it is the slowest rank and the one costed. Each call runs at the kernel's rate
  for its own KV length (cost/mixers.py ``attention_core_efficiency``).
* **Merge** (``_SDPAMerger``, eager elementwise ops, memory-bound): each later step casts the
  block's output to fp32 and folds it into the running fp32 output, ``out - sigmoid(lse_b - lse)
  * (out - out_b)`` (MERGE_BYTES_PER_ELEMENT); the result is cast back once. The K/V buffer is
  re-concatenated (``torch.cat``) before every step but the last. Under torch.compile (a stack
  without eager memory passes: torchtitan-compile) the ring's aten ops are traced with the block
  (DTensor's SDPA handler runs at dispatch, under AOTAutograd's tracing) and TorchInductor fuses
  the merge's pointwise chain into one pass (FUSED_MERGE_BYTES_PER_ELEMENT; Ansel et al. ASPLOS
  2024 Sec. 4); the backward's adds and concatenations are counted as single passes either way.
* **Rotation.** ``_AllGatherRotater`` all-gathers the local K and V once, issued before step 0
  and waited on at step 1: it hides behind step 0's SDPA only. The backward gathers K/V again the
  same way, and passes the fp32 dK / dV accumulators on through ``permute_tensor`` (the
  ``ALL_TO_ALL`` rotater: one send to the next rank) after every step; step i's send is waited on
  after step i+1's SDPA backward, the last one after the loop, with nothing to hide behind.
  That is eager torch: a functional collective returns an ``AsyncCollectiveTensor`` that waits
  at its first use. Traced by torch.compile, ``_maybe_wrap_tensor`` issues ``wait_tensor`` right
  after the collective instead, leaving any overlap to the compiler (pytorch/pytorch
  torch/distributed/_functional_collectives.py, module docstring and ``_maybe_wrap_tensor``), and
  TorchInductor reorders for compute / communication overlap only when asked
  (torch/_inductor/config.py ``reorder_for_compute_comm_overlap``, False by default; torchtitan's
  compile path does not set it). A compiled ring so waits out every collective where it is
  issued: the K/V gathers and each dK / dV send are exposed whole.
* **fp32 accumulation** (``convert_to_f32``): dQ, dK, dV are zero-filled in fp32, each step's
  bf16 gradients are added in (for rank c-1 into the first K/V chunk, then re-concatenated:
  ``_partial_update``), dK|dV concatenated for the send, and dQ, dK, dV cast back at the end.
Arrays over plans; no branching on plan values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms

FP32_BYTES = 4.0
"""``convert_to_f32``: the merged output and the backward's gradient accumulators in fp32."""
CAST_TO_FP32_BYTES = 6.0
"""``out.to(torch.float32)`` of a block: read 2 (bf16), write 4."""
MERGE_BYTES_PER_ELEMENT = CAST_TO_FP32_BYTES + 3.0 * 3.0 * FP32_BYTES
"""One later step's merge per output element: the cast, then three fp32 elementwise ops of two
reads and a write each (``out - out_b``, its product with the sigmoid, ``out - that``; the lse
terms are d times smaller and left out)."""
FUSED_MERGE_BYTES_PER_ELEMENT = 2.0 + 2.0 * FP32_BYTES
"""The same merge as one fused kernel: read the block's bf16 output and the running fp32 output,
write the running output."""
CAST_BACK_BYTES = 6.0
"""A final fp32 -> bf16 cast (read 4, write 2): the merged output; dQ; dK|dV."""
CAT_BYTES_BF16 = 4.0
"""``torch.cat`` of K and V before a send: read 2, write 2 per element."""
ADD_BF16_INTO_FP32_BYTES = 10.0
"""``acc += grad_`` with an fp32 accumulator and a bf16 gradient: read 4 + 2, write 4."""
CAT_BYTES_FP32 = 8.0
"""``torch.cat`` of fp32 chunks (``_partial_update``, and dK|dV for the send): read 4, write 4."""


@dataclass(frozen=True)
class TorchCpCost:
    core_s: np.ndarray
    """Forward: the c SDPA calls and the merge."""
    core_bwd_s: np.ndarray
    """Backward: the c SDPA backward calls and the fp32 accumulation."""
    fwd_comm_s: np.ndarray
    """K/V all-gather of the forward."""
    bwd_comm_s: np.ndarray
    """K/V all-gather and the c fp32 dK/dV sends of the backward."""
    fwd_exposed_s: np.ndarray
    bwd_exposed_s: np.ndarray


def torch_cp_cost(*, c, micro_batch, seq_len: float, heads, dqk: float, dv: float, ab: float,
                  core_peak: float, hbm: float, bwd_ratio: float, efficiency, cp_link,
                  eager: bool = True) -> TorchCpCost:
    """Ring attention of one causal layer on the costed rank c-1 (module docstring) for c > 1.
    ``heads``: h per rank after repeat_kv; ``efficiency(kv_len, causal, backward)``: the fused
    kernel's fraction of peak; ``cp_link``: the CP group's link (cost/comms.py); ``eager``: the
    merge runs as separate aten ops and each collective is waited at first use (False: traced by
    torch.compile: the merge fused, every collective waited where it is issued)."""
    c = np.asarray(c, dtype=float)
    rows = micro_batch * heads * seq_len / c  # b h S/c: rows of the local Q (and K, V)
    block = seq_len / c
    # SDPA FLOPs 2 x (QK^T + AV) per (query, key): 2 rows x keys x (d_qk + d_v); causal step 0 half.
    step0_flops = 2.0 * rows * block * (dqk + dv) * 0.5
    half_flops = 2.0 * rows * (block / 2.0) * (dqk + dv)
    later = c - 1.0
    fwd_step0 = step0_flops / (core_peak * efficiency(block, True, False))
    fwd_half = half_flops / (core_peak * efficiency(block / 2.0, False, False))
    bwd_step0 = bwd_ratio * step0_flops / (core_peak * efficiency(block, True, True))
    bwd_half = bwd_ratio * half_flops / (core_peak * efficiency(block / 2.0, False, True))
    q_el, k_el, v_el = rows * dqk, rows * dqk, rows * dv
    kv_el = k_el + v_el
    merge_per_element = MERGE_BYTES_PER_ELEMENT if eager else FUSED_MERGE_BYTES_PER_ELEMENT
    merge_bytes = later * (merge_per_element * v_el + CAT_BYTES_BF16 * kv_el) + CAST_BACK_BYTES * v_el
    # Backward on rank c-1: zero-fill, step 0's three adds, each later step's half-chunk add and
    # re-concatenation of dK/dV, dK|dV concatenated to send, dQ added, the final casts.
    accum_bytes = (FP32_BYTES * (q_el + kv_el) + ADD_BF16_INTO_FP32_BYTES * (q_el + kv_el)
                   + later * ((ADD_BF16_INTO_FP32_BYTES / 2.0 + CAT_BYTES_FP32) * kv_el
                              + ADD_BF16_INTO_FP32_BYTES * q_el + CAT_BYTES_BF16 * kv_el)
                   + c * CAT_BYTES_FP32 * kv_el + CAST_BACK_BYTES * (q_el + kv_el))
    active = c > 1
    gather = np.where(active, comms.all_gather_time(c * kv_el * ab, c, cp_link), 0.0)
    dkv_send = comms.p2p_time(kv_el * FP32_BYTES, active, cp_link)
    core = np.where(active, fwd_step0 + later * fwd_half + merge_bytes / hbm, 0.0)
    core_bwd = np.where(active, bwd_step0 + later * bwd_half + accum_bytes / hbm, 0.0)
    if eager:  # waited at first use: the gather behind step 0, each send behind the next step
        fwd_exposed = np.maximum(gather - fwd_step0, 0.0)
        bwd_exposed = (np.maximum(gather - bwd_step0, 0.0) + later * np.maximum(dkv_send - bwd_half, 0.0)
                       + dkv_send)
    else:  # traced: waited where issued, nothing hidden
        fwd_exposed = gather
        bwd_exposed = gather + c * dkv_send
    return TorchCpCost(core_s=core, core_bwd_s=core_bwd, fwd_comm_s=gather, bwd_comm_s=gather + c * dkv_send,
                       fwd_exposed_s=np.where(active, fwd_exposed, 0.0),
                       bwd_exposed_s=np.where(active, bwd_exposed, 0.0))
