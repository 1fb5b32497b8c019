"""How meshplan's own runtime runs FSDP2, as the memory model of its stack reads it.

One fact read by two sides: the runtime's mixed precision (``runtime/parallelize.py``
``mixed_precision``: ``MixedPrecisionPolicy(param_dtype=<the plan's 16-bit>, reduce_dtype=
float32)``) and the meshplan stack record (``cost/calib_records.py``), so the estimate holds the
buffers the runtime allocates. What FSDP2 holds beyond the sharded states in a ZeRO-3 backward
(torch 2.13, torch/distributed/fsdp/_fully_shard/, read for this module):

* ``_fsdp_collectives.py foreach_reduce``: a unit's reduce-scatter input is allocated in
  ``reduce_dtype`` for the whole unit (``reduce_scatter_comm.allocate(..., dtype=reduce_dtype)``)
  and the unit's unsharded 16-bit gradients are copied into it before they are freed ("Only after
  the copy-in finishes can we free the gradients"); ``_fsdp_param_group.py post_backward`` keeps
  that input (``comm_ctx.reduce_scatter_states``) until the next unit's post-backward, at most
  ``reduce_scatter_max_input_buffers`` of them (1 by default). So a layer's backward runs beside
  the previous layer's fp32 input while its own 16-bit gradients are produced: 4 + 2 bytes per
  parameter of one layer (Calibration.fsdp_reduce_scatter_bytes_per_param).
* ``_fsdp_state.py _lazy_init``: the root unit skips its reshard after forward only when
  ``reshard_after_forward`` was left to its default; ``apply_dp`` passes it (True under ZeRO-3), so
  the root unit (what ``fully_shard(model)`` holds after the layers were wrapped: the embedding,
  the final norm and the LM head) is freed after forward, gathered again by the LM head's
  backward, first, and freed by its post-backward, after the embedding's backward, last: it is
  gathered through the whole backward (Calibration.fsdp_root_gathered_in_backward).

Pure Python, no torch import.
"""

from __future__ import annotations

from typing import Any

REDUCE_DTYPE = "float32"
"""FSDP2's ``reduce_dtype`` in meshplan's runtime (a ``torch`` dtype name): gradients are
reduce-scattered and kept in fp32, as torchtitan's ``mixed_precision_reduce`` default."""
REDUCE_DTYPE_BYTES = 4
"""Bytes per element of ``REDUCE_DTYPE``."""
GRADIENT_BYTES = 2
"""Bytes per element of a layer's unsharded gradient before its copy into the reduce-scatter
input: the 16-bit ``param_dtype`` the plan's precision gives (bf16; fp8 plans run bf16 matmuls)."""

RUNTIME_SOURCE = ("meshplan's runtime runs FSDP2 with reduce_dtype float32 and reshards its root unit "
                  "after forward under ZeRO-3 (meshplan/fsdp_policy.py, read by runtime/parallelize.py; "
                  "torch 2.13 _fsdp_collectives.py foreach_reduce, _fsdp_param_group.py post_backward, "
                  "_fsdp_state.py _lazy_init)")
"""What the meshplan stack record's FSDP2 memory fields come from."""


def runtime_values() -> dict[str, Any]:
    """The Calibration fields of the meshplan stack that follow from the runtime's FSDP2 use."""
    return {"fsdp_reduce_scatter_bytes_per_param": float(REDUCE_DTYPE_BYTES + GRADIENT_BYTES),
            "fsdp_root_gathered_in_backward": True}


__all__ = ["REDUCE_DTYPE", "REDUCE_DTYPE_BYTES", "GRADIENT_BYTES", "RUNTIME_SOURCE", "runtime_values"]
