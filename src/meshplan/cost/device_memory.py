"""Which memory figure a measurement is, and the cost model's prediction of each.

A published peak memory is one of three figures, and they differ by gigabytes:

* ``allocated``: ``torch.cuda.max_memory_allocated``, the tensors alive at the peak (Megatron-LM's
  "max allocated" report, meshplan's runtime on a GPU);
* ``reserved``: ``torch.cuda.max_memory_reserved``, the allocated peak plus what the caching
  allocator holds beyond it (fragmentation; torchtitan logs this one as "memory");
* ``device``: what the GPU has in use (nvidia-smi, NVML): the reserved figure plus what lies
  outside the caching allocator, the CUDA context with its kernel images and NCCL's buffers.

:func:`outside_allocator_bytes` is the last difference; :func:`predicted_bytes` picks the
prediction a measurement is compared with. Arrays over plans (``PlanArrays``), as the rest of the
vectorised cost model, so that a fit scores many rows at once.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GIB


class MemoryBasis(str, Enum):
    """What a peak memory figure counts (module docstring)."""

    ALLOCATED = "allocated"
    RESERVED = "reserved"
    DEVICE = "device"


DEFAULT_MEMORY_BASIS = MemoryBasis.RESERVED
"""The figure a measurement is compared with when its source does not say: meshplan's peak memory
(the one ``fits`` is decided on)."""


def memory_basis(text: str | None) -> MemoryBasis:
    """The basis a runs CSV names ('allocated', 'reserved', 'device'); blank: the default."""
    value = (text or "").strip().lower()
    if not value:
        return DEFAULT_MEMORY_BASIS
    try:
        return MemoryBasis(value)
    except ValueError:
        raise MeshplanError(f"memory basis {text!r} is not one of "
                            f"{', '.join(b.value for b in MemoryBasis)}") from None


def nccl_communicators(plans: PlanArrays) -> np.ndarray:
    """NCCL communicators a rank uses: one per parallel axis of more than one rank (tensor,
    context, sharded and replicated data, expert parallel; the pipeline's send/recv pairs)."""
    axes = (plans.tp, plans.cp, plans.dp_shard, plans.dp_replicate, plans.ep, plans.pp)
    return sum((np.asarray(a) > 1).astype(float) for a in axes)


def nccl_buffer_bytes(plans: PlanArrays, calib: Calibration) -> np.ndarray:
    """NCCL's own buffers on one GPU: per communicator, channels x peers x NCCL_BUFFSIZE."""
    per_communicator = calib.nccl_channels * calib.nccl_peers_per_channel * calib.nccl_buffer_bytes
    return nccl_communicators(plans) * per_communicator


def outside_allocator_bytes(plans: PlanArrays, calib: Calibration) -> np.ndarray:
    """What a GPU holds outside torch's caching allocator: the CUDA context and NCCL's buffers
    (device total = peak reserved + this)."""
    return calib.cuda_context_gib * GIB + nccl_buffer_bytes(plans, calib)


def predicted_bytes(basis: MemoryBasis, *, allocated_bytes, reserved_bytes, plans: PlanArrays,
                    calib: Calibration):
    """The prediction a measurement on ``basis`` is compared with."""
    if basis == MemoryBasis.ALLOCATED:
        return allocated_bytes
    if basis == MemoryBasis.DEVICE:
        return reserved_bytes + outside_allocator_bytes(plans, calib)
    return reserved_bytes
