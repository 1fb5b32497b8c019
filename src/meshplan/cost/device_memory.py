"""Which memory figure a measurement is, and the cost model's prediction of each.

A published peak memory is one of three figures, and they differ by gigabytes:

* ``allocated``: ``torch.cuda.max_memory_allocated``, the tensors alive at the peak (Megatron-LM's
  "max allocated" report, meshplan's runtime on a GPU);
* ``reserved``: ``torch.cuda.max_memory_reserved``, the allocated peak plus what the caching
  allocator holds beyond it (fragmentation; torchtitan logs this one as "memory");
* ``device``: what the GPU has in use (nvidia-smi, NVML): the reserved figure plus what lies
  outside the caching allocator, the CUDA context with its kernel images and NCCL's buffers.

:func:`outside_allocator_bytes` is the last difference; :func:`predicted_bytes` picks the
prediction a measurement is compared with.

**What "fits" means** (one definition for ``estimate``, ``plan`` and ``validate``): a plan fits a
GPU when its *device* peak, the figure the GPU must hold, is at most the GPU's memory
(:data:`FITS_BASIS`, :func:`device_fits`); the reserved peak alone would call a plan fitting that
leaves no room for the CUDA context and NCCL's buffers. Under expandable segments the allocator
gives its reserve back before it fails an allocation, so there the device peak that must fit
counts the allocated peak, not the reserved (:func:`held_peak_bytes`); the reserved peak, the
figure a run logs, is the same either way. The search compares the reserved peaks of
many plans with one limit, :func:`reserved_limit_bytes`: the memory less the most any plan holds
outside the allocator (:func:`outside_allocator_bound_bytes`), so that every plan the search keeps
is one ``estimate`` calls fitting. Arrays over plans (``PlanArrays``), as the rest of the
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


NCCL_AXES = 6
"""Parallel axes that can each hold a communicator (:func:`nccl_communicators`: tensor, context,
sharded data, replicated data, expert, pipeline)."""

FITS_BASIS = MemoryBasis.DEVICE
"""The peak ``fits`` compares with the GPU's memory (module docstring)."""


def outside_allocator_bound_bytes(calib: Calibration) -> float:
    """The most :func:`outside_allocator_bytes` reaches on any plan: the CUDA context and a
    communicator on every parallel axis."""
    per_communicator = calib.nccl_channels * calib.nccl_peers_per_channel * calib.nccl_buffer_bytes
    return calib.cuda_context_gib * GIB + NCCL_AXES * per_communicator


def held_peak_bytes(reserved_bytes, allocated_bytes, calib: Calibration):
    """What of a peak the GPU must hold: the reserved peak with the default allocator, which frees
    only segments with no live block left; the allocated peak under expandable segments, whose
    free pages the allocator unmaps before it reports out of memory
    (Calibration.allocator_expandable_segments)."""
    return allocated_bytes if calib.allocator_expandable_segments else reserved_bytes


def device_fits(held_bytes, plans: PlanArrays, calib: Calibration, memory_bytes: float) -> np.ndarray:
    """Whether each plan's device peak (what it must hold of its peak, :func:`held_peak_bytes`,
    + what lies outside the allocator) is within ``memory_bytes``: the one test of "fits"
    (:data:`FITS_BASIS`)."""
    return held_bytes + outside_allocator_bytes(plans, calib) <= memory_bytes


def reserved_limit_bytes(memory_bytes: float, calib: Calibration) -> float:
    """The reserved peak any plan may reach and still fit ``memory_bytes`` of device memory (the
    search's limit): ``memory_bytes`` less :func:`outside_allocator_bound_bytes`. A plan within it
    passes :func:`device_fits`; one with fewer communicators may fit a little above it, and so may
    one under expandable segments, which holds its allocated peak only."""
    return max(memory_bytes - outside_allocator_bound_bytes(calib), 0.0)


def predicted_bytes(basis: MemoryBasis, *, allocated_bytes, reserved_bytes, plans: PlanArrays,
                    calib: Calibration):
    """The prediction a measurement on ``basis`` is compared with."""
    if basis == MemoryBasis.ALLOCATED:
        return allocated_bytes
    if basis == MemoryBasis.DEVICE:
        return reserved_bytes + outside_allocator_bytes(plans, calib)
    return reserved_bytes
