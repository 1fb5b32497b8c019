"""Communication factors of :class:`~meshplan.cost.calibration.Calibration`: link
efficiency, per-collective latency/bandwidth factors, per-layer comm overheads, overlaps.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CommFields"]


@dataclass(frozen=True, kw_only=True)
class CommFields:
    """Collective efficiency and factors, per-layer comm overheads, and what overlaps compute."""

    intra_node_comm_efficiency: float = 0.75
    """Fraction of NVLink bandwidth reached by NCCL collectives (nccl-tests bus bandwidth on
    DGX A100/H100 is ~70-80% of the link rate)."""
    inter_node_comm_efficiency: float = 0.80
    """Fraction of the NIC line rate reached by NCCL across nodes (nccl-tests on InfiniBand)."""
    ring_nic_spread: float = 1.0
    """Share of the NICs of a ring group's members in one NVLink domain that a ring collective
    crossing domains sends through: the ring runs at min(NVLink, max(1, spread x g) x NIC per
    GPU) for g members per domain (cost/comms.py). 1: NCCL's rings, one per channel, each
    crossing through a different member's NIC (nccl-tests doc/PERFORMANCE.md: across nodes the
    bus bandwidth is the node's NICs); 0: one NIC share per rank, as a stack whose collectives
    do not use NCCL's multi-channel rings gets. Fitted per (generation, stack)."""
    comm_half_message_bytes: float = 0.0
    """Message size at which a per-layer collective (TP, CP, EP) reaches half its bandwidth:
    effective bandwidth = W * M / (M + comm_half_message_bytes). NCCL's bus bandwidth ramps up
    with the message size and saturates only at hundreds of MB on 8 GPUs (nccl-tests curves,
    NCCL performance docs), so smaller micro-batches send smaller, slower messages."""
    # Per-collective factors on the link's alpha and W. The link figures (cluster) are one
    # alpha-beta line for all collectives; NCCL's ring collectives all reach about the same bus
    # bandwidth (nccl-tests doc/PERFORMANCE.md), hence 1. A profile measures each op (gloo's
    # reduce-scatter, for one, runs at a third of its all-gather's rate): meshplan.calib.hwcalib.
    all_reduce_latency_factor: float = 1.0
    """alpha of one ring step of an all-reduce, over the link's alpha."""
    all_gather_latency_factor: float = 1.0
    reduce_scatter_latency_factor: float = 1.0
    all_to_all_latency_factor: float = 1.0
    send_recv_latency_factor: float = 1.0
    tp_all_gather_latency_factor: float = 1.0
    """TP + SP's all-gather along the sequence through DTensor (Shard(1) -> Replicate); on NCCL
    the same collective plus a device-side copy, hence 1."""
    tp_reduce_scatter_latency_factor: float = 1.0
    """TP + SP's reduce-scatter to sequence shards through DTensor (Partial -> Shard(1))."""
    all_reduce_bandwidth_factor: float = 1.0
    """Bus bandwidth of an all-reduce over the link's W."""
    all_gather_bandwidth_factor: float = 1.0
    reduce_scatter_bandwidth_factor: float = 1.0
    all_to_all_bandwidth_factor: float = 1.0
    send_recv_bandwidth_factor: float = 1.0
    tp_all_gather_bandwidth_factor: float = 1.0
    tp_reduce_scatter_bandwidth_factor: float = 1.0
    # Time the runtime's own path spends per layer around its collectives beyond alpha + bytes/W
    # (DTensor / FSDP2 dispatch, functional-collective wrapping, the copies around each call,
    # and the wake-up of the rank that waited), per layer, per forward+backward of one
    # micro-batch, per extra rank of the group (group of n: n - 1 times). 0 on GPUs: the host
    # enqueues NCCL kernels asynchronously and runs ahead of the device, so this host time hides
    # behind device work (PyTorch CUDA semantics, 'Asynchronous execution'). `meshplan profile`
    # measures it on the runtime's own model (profile/layer_probe.py): a layer too small for
    # its math or bytes to count, under each parallelism, less what the formulas predict for it.
    tp_layer_overhead_s: float = 0.0
    """Tensor (+ sequence) parallel layer: DTensor-sharded linears and their 4+4 collectives."""
    cp_layer_overhead_s: float = 0.0
    """Context-parallel layer (measured with all-to-all attention, applied to ring CP too)."""
    fsdp_layer_overhead_s: float = 0.0
    """ZeRO-2/3 (FSDP2) layer: its parameter all-gathers and gradient reduce-scatter, charged per
    micro-batch."""
    dp_layer_overhead_s: float = 0.0
    """Data-parallel layer (zero 0/1): its gradient reduction, once per step (per layer, not per
    micro-batch: gradients accumulate locally until the last micro-batch)."""
    tp_overlap: float = 0.0
    """Fraction of tensor-parallel communication hidden behind compute (0 for Megatron 2021-22;
    async TP / TE userbuffers overlap some)."""
    tp_backward_async: bool = False
    """Whether the backward issues the column-parallel linears' input-gradient all-reduce (under
    sequence parallel: reduce-scatter) and SP's input re-gather asynchronously behind the same
    linear's GEMMs, as Megatron-LM does from 2022 (Korthikanti et al. 2022's code,
    LinearWithGradAccumulationAndAsyncCommunication; cost/tp_backward.py); Megatron-LM 2020-21
    and BigScience's Megatron-DeepSpeed all-reduce synchronously. A stack field (frameworks.json)."""
    dp_overlap: float = 0.8
    """Fraction of the data-parallel gradient reduce (and ZeRO-1/2 parameter all-gather) hidden
    behind the backward pass (PyTorch DDP bucketing, Li et al. 2020 Sec. 3.2.3), bounded by the
    backward time of the last micro-batch."""
    fsdp_overlap: float = 0.9
    """Fraction of ZeRO-3/FSDP per-micro-batch all-gathers and reduce-scatters hidden behind
    compute with prefetching (Zhao et al. 2023, PyTorch FSDP, Sec. 3.3), bounded by that compute."""
    cp_overlap: float = 0.8
    """Fraction of ring context-parallel K/V passes hidden behind attention compute (Liu et al.
    2023, Ring Attention Sec. 3)."""
    ep_overlap: float = 0.0
    """Fraction of expert-parallel all-to-all hidden behind compute (none without DualPipe-like
    scheduling)."""
    pp_p2p_overlap: float = 0.5
    """Fraction of pipeline send/recv hidden behind compute (Megatron overlaps p2p with the next
    micro-batch in the steady state, Narayanan et al. 2021 Sec. 4.1)."""
    zero_bubble_residual: float = 0.15
    """Fraction of the 1F1B bubble left by zero-bubble schedules (Qi et al. 2024, ZB-H1 removes
    most of it)."""
