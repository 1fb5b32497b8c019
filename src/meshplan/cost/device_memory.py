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
figure a run logs, is the same either way. The search ranks plans on that same figure
(:func:`fit_bytes`: a rank's held peak + what lies outside the allocator) and compares it with the
memory itself, so that the plans it keeps are exactly the ones ``estimate`` calls fitting, under
either allocator setting. Arrays over plans (``PlanArrays``), as the rest of the vectorised cost
model, so that a fit scores many rows at once.
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


FITS_BASIS = MemoryBasis.DEVICE
"""The peak ``fits`` compares with the GPU's memory (module docstring)."""


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


def held_fragmentation(calib: Calibration) -> float:
    """The allocator's reserve a plan must hold, per byte it allocates (cost.memory.rank_other's
    reserve): ``allocator_fragmentation``, none under expandable segments (:func:`held_peak_bytes`)."""
    return 0.0 if calib.allocator_expandable_segments else calib.allocator_fragmentation


def fit_bytes(reserved_bytes, reserve_bytes, plans: PlanArrays, calib: Calibration):
    """The device peak "fits" compares with the GPU's memory, of a rank whose reserved peak is
    ``reserved_bytes``, ``reserve_bytes`` of it the allocator's reserve: its held peak
    (:func:`held_peak_bytes`) + what lies outside the allocator. What the search ranks plans on: a
    plan fits ``memory_bytes`` exactly when its ranks' largest ``fit_bytes`` is within it
    (:func:`device_fits`)."""
    held = held_peak_bytes(reserved_bytes, reserved_bytes - reserve_bytes, calib)
    return held + outside_allocator_bytes(plans, calib)


def predicted_bytes(basis: MemoryBasis, *, allocated_bytes, reserved_bytes, plans: PlanArrays,
                    calib: Calibration):
    """The prediction a measurement on ``basis`` is compared with."""
    if basis == MemoryBasis.ALLOCATED:
        return allocated_bytes
    if basis == MemoryBasis.DEVICE:
        return reserved_bytes + outside_allocator_bytes(plans, calib)
    return reserved_bytes
