"""Runtime-mechanism fields of :class:`~meshplan.cost.calibration.Calibration` (the tail
of its memory group): what FSDP keeps under pipelining, the recompute policy, activation
offload overlap, the MoE dispatch kernels, full-iteration CUDA graphs.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MechanismFields"]


@dataclass(frozen=True, kw_only=True)
class MechanismFields:
    """How a stack runs a plan: FSDP under PP, recompute policy, offload, MoE kernels, CUDA graphs."""

    fsdp_pp_keeps_unsharded: bool = True
    """With pipeline parallelism, FSDP does not reshard a stage's parameters after the forward
    (torchtitan's default reshard_after_forward policy under PP: the backward of in-flight
    micro-batches would gather them again), so a rank holds its whole stage unsharded. A stack
    field (meshplan's runtime reshards after forward and backward: runtime/pipeline.py ZeroStage)."""
    fsdp_pp_accumulates_unsharded_grads: bool = False
    """With pipeline parallelism, FSDP accumulates each micro-batch's gradients unsharded in the
    reduce dtype and reduce-scatters once after the last backward (torch.distributed.pipelining's
    PipelineStage turns off gradient sync and resharding after backward until then), so a rank
    holds its whole stage's gradients unsharded beside the gathered weights. The reduce-scatter
    runs per stage, right after that stage's last backward: under interleaved 1F1B with m <= p a
    rank holds one virtual stage's gradients at a time (cost/memory.py accumulated_grad_params).
    A stack field."""
    zero_bubble_keeps_unsharded: bool = False
    """Under the zero-bubble schedule's split backward (input gradients, then weight gradients),
    FSDP with pipelining keeps the stage gathered and its gradients unsharded whatever the two
    fields above say: a weight backward needs the gathered weights after the input backward, so
    the stack runs torch's PipelineStage behaviour there (meshplan's runtime/pipeline.py
    ZeroStage). A stack field."""
    op_selective_recompute: bool = False
    """Selective recompute is an op-level policy (torchtitan's op SAC: the block input, every
    other mm output, the attention kernel's output; cost/op_recompute.py) instead of Megatron's
    core-attention recompute that keeps everything else (Korthikanti et al. 2022, Sec. 5). A
    stack field."""
    activation_offload_overlap: float = 0.0
    """Fraction of the activation offload copies (down in the forward, up in the backward) hidden
    behind compute: 0 for torch's ``save_on_cpu`` (meshplan's runtime: copies on the compute stream,
    torch.autograd.graph, torch 2.13); Megatron-Core's ``cpu_offloading`` copies each layer on
    streams of its own, double-buffered, while the next layers compute (megatron/core/cpu_offload.py;
    Megatron-Bridge's CPU-offloading guide: "overlap computation with data transfer"), 1 for the
    megatron-core framework (spec/presets/frameworks.json). A stack-dependent field."""
    moe_dispatch_nvlink_efficiency: float = 0.0
    """Fraction of the NVLink bandwidth the expert dispatch and combine reach inside one scale-up
    domain when its kernels are not NCCL's; 0: they are (``intra_node_comm_efficiency`` applies).
    Set per row by a Megatron-Bridge preset that runs HybridEP (calib/recipe_overlay.py
    HYBRIDEP_NVLINK_EFFICIENCY): TMA copies over NVLink that saturate it with 4-16 SMs (NVIDIA
    Technical Blog, 'Optimizing Communication for Mixture-of-Experts Training with Hybrid Expert
    Parallel', 2026-02-02)."""
    moe_flex_host_sync: bool = False
    """Under the flex dispatcher, the dispatch still waits on the host once per MoE layer for the
    received token counts (``moe_alltoall_sync_s`` charged as for the dropless alltoall
    dispatcher): DeepEP's normal kernels, whose notify step has "the CPU ... wait for GPU's signal
    to arrive" (Megatron-Core moe/fused_a2a.py; DeepEP README, normal kernels: "CPU-GPU
    synchronization"). False: HybridEP, which sizes its buffers on the device. Set per row by a
    Megatron-Bridge preset that runs DeepEP (calib/recipe_overlay.py)."""
    cuda_graph_full_iteration: bool = False
    """The whole forward-backward is captured once and replayed as one CUDA graph (Megatron-Core
    ``cuda_graph_impl='full_iteration'``): the host issues no kernel of a layer (cost/host.py
    charges none) and nothing in the step may wait for the host, so a dropless MoE layer runs
    sync-free (HybridEP and grouped GEMMs sized from a static per-rank capacity, with paged
    stashing of the variable-size activations: Megatron-LM docs 'MoE Paged Stash'; Yan et al.
    2026, Megatron-Core MoE, arXiv 2603.07685, Sec. 4.3.6-4.3.7) and ``moe_alltoall_sync_s`` is
    not charged. A stack field, set by a release's presets (spec/presets/stack_releases.json)."""
    moe_fused_grouped_mlp: bool = False
    """The experts' FC1, activation and FC2 run as one fused grouped kernel over all local experts
    (Megatron-Bridge ``cutedsl_fused_grouped_mlp``; TE op fuser's GroupedMLP): no launch and tail
    per local expert (``moe_expert_gemm_s`` not charged) and no grouped-GEMM falloff beyond a
    single GEMM's (``moe_grouped_gemm_half_dim`` not applied: one persistent kernel schedules
    all experts' tiles together; Yan et al. 2026, Sec. 4.3.2). A stack field, set by a release's
    presets (spec/presets/stack_releases.json)."""
