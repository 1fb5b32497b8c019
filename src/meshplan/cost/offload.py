"""Offload to host memory: what it moves off the GPU and what its transfers and host step cost.

Three choices, each alone or together (``meshplan.plan.Offload``; the search's bit mask
``PlanArrays.offload``):

* optimizer states (ZeRO-Offload, Ren et al. 2021, Sec. 4): the GPU's shard of the fp32 master
  weights and Adam moments lives on the host; every step the gradient shard goes down (D2H,
  overlapped with the backward, Sec. 4.2), the host runs Adam (CPU-Adam, Sec. 5.1: bound by host
  memory bandwidth) and the updated weights come back up (H2D, on the critical path: no
  delayed parameter update is modelled).
* parameters with their gradients (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 5; FSDP2's
  ``CPUOffloadPolicy``): the ZeRO-3 shard lives on the host; each micro-batch copies it up before
  each of the two all-gathers (forward, backward) and its gradient shard down after the
  reduce-scatter, overlapped like FSDP's prefetch.
* activations (torch's ``save_on_cpu``; Megatron's activation offloading): the tensors a layer
  saves for backward go down in the forward and come back up in the backward; the GPU keeps the
  layer in flight and the one being copied. Megatron-Core offloads only the first
  ``cpu_offloading_num_layers`` layers (``Plan.offload_layers``): that share of the activations.

Symbols: W_h host-device bandwidth per GPU and direction (``ClusterSpec``), B_h host memory
bandwidth per node shared by its GPUs. A transfer of ``n`` bytes takes ``n / W_h``; activation
copies, which every GPU of the node makes at once, ``n / min(W_h, B_h x eff / gpus_per_node)``; CPU Adam over
``P`` parameters takes ``P * CPU_ADAM_BYTES_PER_PARAM / (B_h / gpus_per_node * efficiency)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.errors import MeshplanError
from meshplan.plan import OFFLOAD_ACTIVATIONS_BIT, OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT
from meshplan.spec.cluster import GIB, ClusterSpec


@dataclass(frozen=True, kw_only=True)
class OffloadFactors:
    """Named factors of the offload model, each with its source."""

    cpu_adam_bytes_per_param: float = 30.0
    """Host bytes one CPU-Adam update moves per parameter: read and write the fp32 master weight
    and both moments (2 x 12), read the fp32 gradient (4), write the bf16 weight sent up (2)
    (ZeRO-Offload keeps fp32 gradients on the host, Ren et al. 2021, Sec. 4.1)."""
    cpu_adam_bandwidth_efficiency: float = 0.5
    """Fraction of the node's peak DRAM bandwidth a streaming kernel sustains on a multi-socket
    server (STREAM triad on 2-socket Xeon/EPYC reaches 50-70% of the DDR peak); CPU-Adam is such
    a kernel (AVX-512 over contiguous fp32 arrays, Ren et al. 2021, Sec. 5.1)."""
    host_memory_usable_fraction: float = 0.8
    """Of the node's host memory, what offloaded tensors may use: the OS, page cache, data-loader
    workers and pinned staging buffers take the rest (DeepSpeed's ZeRO-Infinity guidance sizes
    pinned buffers at a few GB per GPU and warns against using all of host memory)."""
    param_transfer_overlap: float = 1.0
    """Fraction of the parameter-shard uploads hidden behind compute: FSDP2 copies a shard up in
    the all-gather's copy-in on its own stream, prefetching the next layer's (torch.distributed.fsdp,
    ``CPUOffloadPolicy``); ZeRO-Infinity prefetches likewise (Rajbhandari et al. 2021, Sec. 6.2)."""
    gradient_d2h_overlap: float = 1.0
    """Fraction of the per-step gradient download hidden behind the backward: ZeRO-Offload
    streams each bucket down as soon as it is reduced (Ren et al. 2021, Sec. 4.2)."""


OFFLOAD_FACTORS = OffloadFactors()


@dataclass(frozen=True)
class OffloadCost:
    """Arrays over plans for one pipeline rank: bytes moved to the host, and time."""

    parameters_saved_bytes: np.ndarray
    gradients_saved_bytes: np.ndarray
    optimizer_saved_bytes: np.ndarray
    activations_saved_bytes: np.ndarray
    host_bytes: np.ndarray
    """Host memory this GPU's offloaded tensors take."""
    microbatch_exposed_s: np.ndarray
    microbatch_total_s: np.ndarray
    step_exposed_s: np.ndarray
    """Per step: gradient download left exposed, CPU Adam, weights back up."""
    step_total_s: np.ndarray


def check_offload_hardware(cluster: ClusterSpec) -> None:
    """Raise when the cluster does not say how fast and how large its host side is."""
    if not (cluster.host_device_bandwidth_bytes_per_s and cluster.host_memory_gib_per_node
            and cluster.host_memory_bandwidth_bytes_per_s):
        raise MeshplanError(
            f"cluster {cluster.name!r} gives no host_device_bandwidth_bytes_per_s, "
            "host_memory_gib_per_node and host_memory_bandwidth_bytes_per_s: offload cannot be "
            "estimated (add them to the cluster file)")


def can_offload(cluster: ClusterSpec) -> bool:
    try:
        check_offload_hardware(cluster)
    except MeshplanError:
        return False
    return True


def host_budget_bytes(cluster: ClusterSpec, factors: OffloadFactors = OFFLOAD_FACTORS) -> float:
    """Host memory one GPU's offloaded tensors may use (its share of the node)."""
    return (cluster.host_memory_gib_per_node * GIB * factors.host_memory_usable_fraction
            / cluster.gpus_per_node)


def activation_copy_bytes_per_s(cluster: ClusterSpec) -> float:
    """Rate of one GPU's activation copies, one direction: its own host link, or its share of the
    node's host DRAM that every GPU's copies stream through at once (all GPUs of a data-parallel
    step offload together; on GB200 / GB300 two Blackwell share one Grace's LPDDR5X), whichever
    is lower: min(W_h, B_h x ``host_memory_stream_efficiency`` / gpus_per_node)."""
    dram = (cluster.host_memory_bandwidth_bytes_per_s * cluster.host_memory_stream_efficiency
            / cluster.gpus_per_node)
    return min(cluster.host_device_bandwidth_bytes_per_s, dram)


def offload_schedule_exposed_s(copy_s, layer_s, offloaded, layers):
    """Time one pass stalls on the copies of the first ``offloaded`` of ``layers`` layers.

    Transformer Engine's ``OffloadSynchronizer`` (transformer_engine/pytorch/cpu_offload.py@00382b96,
    ``_default_offload_sync_init``; Megatron-Core's ``--cpu-offloading-num-layers`` goes through it)
    copies layer i down on one stream once its forward ends and waits for that copy before the
    forward of layer L - N + i; in the backward it starts reloading layer i before the backward of
    layer L - 1 - N + i and waits for it before layer i's. With every layer's copy ``c`` and pass
    ``f`` alike, the pass and the stream form a max-plus chain whose longest path gives the stall:
    detours through k copies gain k (c - f) - (L - N - 2) f, so with L - N >= 2 the worst is all
    N at once, max(0, N c - (L - 2) f) (the copies serialise over the L - 2 layers between the
    first copy's start and the last deadline), and with N = L - 1 every copy stalls the next layer
    whole, N c. tests/planner/test_offload_schedule.py checks it against an event simulation.
    """
    c, f = np.asarray(copy_s, dtype=float), np.asarray(layer_s, dtype=float)
    n, total = np.asarray(offloaded, dtype=float), np.asarray(layers, dtype=float)
    spread = np.maximum(0.0, n * c - (total - 2.0) * f)
    return np.where(n <= 0, 0.0, np.where(total - n < 2.0, n * c, spread))


def rank_offload(cluster: ClusterSpec, code: np.ndarray, *, weights_bytes, grads_bytes, optim_bytes,
                 microbatch_activations_bytes, stored_activations_bytes, layer_activation_bytes,
                 layers, params_on_gpu, compute_s, backward_s, offloaded_layers=None, forward_s=None,
                 activation_overlap: float = 0.0,
                 factors: OffloadFactors = OFFLOAD_FACTORS) -> OffloadCost:
    """Offload of one pipeline rank (arrays over plans; ``code`` the offload bit mask).

    ``weights/grads/optim_bytes`` are the rank's shards after ZeRO, ``stored_activations_bytes``
    the layer activations it holds at its peak (all micro-batches in flight), of which one layer
    of one micro-batch is ``layer_activation_bytes``; ``params_on_gpu`` the rank's parameters
    before ZeRO over the optimizer's shards (what the host updates); ``compute_s`` and
    ``backward_s`` (and ``forward_s``: the layers' forward, default compute - backward) per
    micro-batch hide the transfers; ``offloaded_layers`` of the ``layers`` have
    their activations offloaded (None: all), whose copies the stack hides behind compute by
    ``activation_overlap`` (``Calibration.activation_offload_overlap``).
    """
    zero = np.zeros(np.shape(code))
    if not np.any(code):
        return OffloadCost(zero, zero, zero, zero, zero, zero, zero, zero, zero)
    check_offload_hardware(cluster)
    w_h = cluster.host_device_bandwidth_bytes_per_s
    opt = (code & OFFLOAD_OPTIMIZER_BIT) > 0
    par = (code & OFFLOAD_PARAMS_BIT) > 0
    act = (code & OFFLOAD_ACTIVATIONS_BIT) > 0

    optim_saved = np.where(opt, optim_bytes, 0.0)
    weights_saved = np.where(par, weights_bytes, 0.0)
    grads_saved = np.where(par, grads_bytes, 0.0)
    # The GPU keeps the layer whose activations are being produced or consumed and the one in
    # transit (double buffering), per micro-batch in flight on the first copy only.
    kept = np.minimum(2.0, layers) * layer_activation_bytes
    # Offloading N of the L layers moves N/L of what they store (and of what they copy).
    share = (1.0 if offloaded_layers is None
             else np.clip(np.asarray(offloaded_layers, dtype=float) / np.maximum(layers, 1.0), 0.0, 1.0))
    act_saved = np.where(act, np.minimum(np.maximum(stored_activations_bytes - kept, 0.0),
                                         share * stored_activations_bytes), 0.0)

    # ---- per micro-batch: parameter shards up twice, gradient shard down once (ZeRO-Infinity);
    # activations down in forward and up in backward.
    par_mb = np.where(par, (2.0 * weights_bytes + grads_bytes) / w_h, 0.0)
    # Activations go down during the forward and come back during the backward, one copy stream,
    # layer by layer, each direction hidden only behind its own pass (offload_schedule_exposed_s).
    act_one_way = np.where(act, share * microbatch_activations_bytes / activation_copy_bytes_per_s(cluster), 0.0)
    act_mb = 2.0 * act_one_way
    mb_total = par_mb + act_mb
    n_off = share * layers
    fwd_s = np.maximum(compute_s - backward_s, 0.0) if forward_s is None else forward_s
    act_exposed = np.zeros(np.shape(act_one_way))
    if np.any(act):
        act_exposed = np.where(act, sum(
            (1.0 - activation_overlap) * act_one_way + activation_overlap * offload_schedule_exposed_s(
                act_one_way / np.maximum(n_off, 1.0), pass_s / np.maximum(layers, 1.0), n_off, layers)
            for pass_s in (fwd_s, backward_s)), 0.0)
    mb_exposed = comms.exposed(par_mb, factors.param_transfer_overlap, compute_s) + act_exposed

    # ---- per step: gradients down (unless already there), CPU Adam, weights up --------------
    host_bw = (cluster.host_memory_bandwidth_bytes_per_s / cluster.gpus_per_node
               * factors.cpu_adam_bandwidth_efficiency)
    adam_s = params_on_gpu * factors.cpu_adam_bytes_per_param / host_bw
    grads_down = np.where(par, 0.0, grads_bytes / w_h)
    weights_up = np.where(par, 0.0, weights_bytes / w_h)
    step_total = np.where(opt, grads_down + adam_s + weights_up, 0.0)
    step_exposed = np.where(opt, comms.exposed(grads_down, factors.gradient_d2h_overlap, backward_s)
                            + adam_s + weights_up, 0.0)

    host = optim_saved + weights_saved + grads_saved + act_saved
    return OffloadCost(parameters_saved_bytes=weights_saved, gradients_saved_bytes=grads_saved,
                       optimizer_saved_bytes=optim_saved, activations_saved_bytes=act_saved,
                       host_bytes=host, microbatch_exposed_s=mb_exposed, microbatch_total_s=mb_total,
                       step_exposed_s=step_exposed, step_total_s=step_total)
