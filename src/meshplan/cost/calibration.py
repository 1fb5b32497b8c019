"""Every efficiency, overlap and overhead factor of the cost model, with its source.

The formulas in :mod:`meshplan.cost` only ever read factors from a :class:`Calibration`; no bare
tuning numbers appear inside a formula. A training stack is a named calibration (issue 14, item
6): ``calibration_for(gpu, stack)`` layers the literature defaults, the stack's mechanisms (what
it overlaps, its fixed host costs: ``STACK_FIELDS``, each stack's with its source) and the values
fitted on published runs for the (GPU generation, stack) pair, all kept as data with their
source (``FITTED_FILE``; ``meshplan validate --fit --write-calibration --out PATH`` writes a refit).
Loading that file is :mod:`meshplan.cost.calib_records`'s, the order in which its parts apply
:mod:`meshplan.cost.stack_resolution`'s; this module keeps the dataclass and ``calibration_for``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping

from meshplan.cost.attention_kernels import check_kernel
from meshplan.cost.calib_records import (DEFAULT_STACK, FITTED_FILE, FittedRecord, StackRecord, gpu_family,
                                         gpu_generation, lender_keys, read_fitted_records, read_stack_records,
                                         record_key)
from meshplan.cost.generation_transfer import generation_transfers
from meshplan.cost.stack_resolution import resolve_calibration
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GPUSpec
from meshplan.spec.training import Precision

__all__ = [  # the data file's names stay importable from here (cost/calib_records.py)
    "DEFAULT_STACK", "FITTED_FILE", "STACK_FIELDS", "Calibration", "FittedRecord", "StackRecord", "calibration_for",
    "fitted_records", "gpu_family", "gpu_generation", "record_key", "stack_names", "stack_records",
]


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Named factors of the cost model. ``source`` says where the values came from."""

    source: str = "defaults"
    """Free text: 'defaults', 'fitted on runs_calibration.csv', 'hardware profile ...'."""

    # ---- compute ------------------------------------------------------------------------
    matmul_efficiency: float = 0.70
    """Fraction of dense peak FLOP/s that a large, well-shaped GEMM reaches (cuBLAS on A100/H100
    sustains ~70-80% of peak on large bf16 GEMMs; NVIDIA Deep Learning Performance guide)."""
    matmul_half_dim: float = 128.0
    """Small-matmul falloff: efficiency = matmul_efficiency * x / (x + matmul_half_dim), where x is
    the smallest per-GPU GEMM dimension. Tiles of 128-256 leave small GEMMs under-occupied
    (NVIDIA matrix-multiplication background guide, 'wave quantization / tile quantization')."""
    unaligned_matmul_factor: float = 0.5
    """Extra factor for a GEMM with a dimension not a multiple of 8, e.g. the attention GEMMs of
    a head dim of 108 (fp16/bf16 tensor cores need multiples of 8 elements, else cuBLAS falls
    back to slower or non-tensor-core kernels; NVIDIA Deep Learning Performance guide, 'Matrix
    Multiplication Background', 'Tensor Core requirements'). Applied to the attention core too
    (fused attention kernels also need head dims that are multiples of 8)."""
    vocab_pad_multiple: float = 128.0
    """The LM head's vocabulary is padded to a multiple of this per tensor-parallel rank
    (Megatron-LM --make-vocab-size-divisible-by, default 128, times tp), which keeps the
    head GEMM aligned for tensor cores (e.g. BLOOM's 250,000 -> 250,880). 1 = no padding."""
    layer_overhead_s: float = 0.0
    """Fixed time per transformer layer per micro-batch forward (backward 2x), independent of
    the tokens: CUDA kernel launches and host-side framework work (a Megatron layer forward is
    ~30-60 kernels at ~5-20 us of launch / Python dispatch each; the reason CUDA graphs help
    small batches, PyTorch blog 'Accelerating PyTorch with CUDA Graphs' 2021), and the per-call
    latency of the layer's TP collectives beyond the alpha term. It is amortised by larger
    micro-batches, which is why measured throughput grows with the micro-batch size. Not charged
    under ``cuda_graph_full_iteration`` (cost/layer.py: the replayed graph issues no launch)."""
    microbatch_overhead_s: float = 0.0
    """Fixed time per micro-batch (forward + backward) on every pipeline rank, independent of
    the layers it holds: the host work of the schedule (the loss and its scaling, posting the
    pipeline sends/receives, the data iterator, hooks of the distributed optimizer) that a small
    model cannot hide behind device work (PyTorch CUDA semantics, 'Asynchronous execution').
    A stack field (STACK_FIELDS), fitted per (generation, stack)."""
    host_s_per_kernel: float = 0.0
    """Host time to issue one kernel from the training loop: Python, the PyTorch dispatcher and
    cudaLaunchKernel, 5-20 us per op in eager PyTorch (PyTorch blog 'Accelerating PyTorch with
    CUDA Graphs', 2021; NVIDIA 'CUDA Graph Best Practice for PyTorch', 'CUDA Graph basics'); ~0
    under CUDA graphs (one graph launch per captured region). A layer
    takes max(device time, its kernels x this) (cost/host.py). A stack field: 0 = not modelled."""
    host_fused_kernels: bool = False
    """The stack runs a layer as fused kernels (Megatron-Core + Transformer Engine, torch.compile:
    norm, rotary, activation, residual one kernel each; QKV and gate/up one GEMM), not one kernel
    per aten op of eager model code (cost/host.py counts both). A stack field."""
    eager_memory_passes: bool = False
    """The stack runs its layers' memory-bound ops as eager model code, one aten op per kernel and
    an HBM round trip each (torchtitan's llama3 model: RMSNorm through fp32 in 8 ops, complex
    RoPE, repeat_kv copies, separate silu and multiply), not one fused pass per op: the extra
    bytes of cost/eager_passes.py. A stack field (frameworks.json sets it for torchtitan runs;
    torch.compile'd runs are fused); never on a CPU device, whose elementwise probe measures the
    runtime's eager modules (elementwise_time_factor)."""
    elementwise_time_factor: float = 1.0
    """Time of a layer's memory-bound ops (norms, residual adds, activation function) over their
    bytes / (W_hbm * hbm_efficiency), the one-pass-per-op count of fused kernels (Megatron/TE,
    torch.compile): 1. Eager PyTorch runs more passes (rotary embedding, GQA's repeated K/V, the
    saved tensors of autograd); a CPU profile measures meshplan's runtime modules (the
    elementwise probe, meshplan.calib.layer_probe)."""
    attention_efficiency: float = 0.55
    """Fraction of peak reached by the attention core (FlashAttention-2 reaches 50-73% of A100
    peak forward+backward, Dao 2023 Sec. 4.1). A (generation, stack) without a fitted record
    starts from the table of its stack's attention_kernel (cost/attention_kernels.py:
    FlashAttention-2 reaches 35% of H100, FA3 / cuDNN ~60%); a fitted record's value wins."""
    attention_kernel: str = "fa2"
    """The fused attention kernel the stack runs (a stack field): 'fa2' (flash-attn 2, torch
    SDPA's flash backend), 'fa3', 'fa4' or 'cudnn' (Transformer Engine's cuDNN fused attention);
    the names of spec/presets/attention_kernels.json, whose efficiency per GPU generation
    calibration_for starts from."""
    attention_half_head_dim: float = 64.0
    """Head dim at which a fused attention kernel reaches half its large-head efficiency:
    efficiency x H / (H + attention_half_head_dim). Its own constant, not the GEMM's
    matmul_half_dim: the kernel's tiles span the whole sequence, only the inner (head) dim of
    its two GEMMs is small. FlashAttention-3 forward, H100 bf16, 16k: ~500, ~650 and ~750
    TFLOP/s at head dims 64, 128 and 256 (Shah et al. 2024, Fig. 5), i.e. ~55-65."""
    fused_attention: bool = True
    """Attention scores are never materialised (FlashAttention, Dao et al. 2022): no s^2 term in
    activation memory or in HBM traffic. Megatron-LM 2021/2022 runs did not use it."""
    hbm_efficiency: float = 0.80
    """Fraction of HBM bandwidth reached by memory-bound kernels (norms, activations, softmax,
    optimizer); STREAM-like copies reach ~80-90% (vendor guides)."""
    dropout: bool = False
    """Whether the layers use dropout (GPT-3/Megatron 2021-2022 runs: yes, Llama: no). Adds the
    2sbh bytes of masks of Korthikanti et al. 2022, Sec. 4.1, and their memory-bound time."""

    # ---- precision per operation (cost/precision.py) --------------------------------------
    fp8_matmul_factor: float = 0.85
    """Fraction of the fp8 peak an fp8 GEMM reaches, over the fraction a bf16 GEMM of the same
    shape reaches of the bf16 peak: cuBLASLt fp8 GEMMs on H100 sustain ~1.6-1.8x, not 2x, the
    bf16 rate on large shapes (NVIDIA Transformer Engine performance notes; scaling and amax
    epilogues). Literature default; fitted per stack (calib/fit.py)."""
    fp4_matmul_factor: float = 0.75
    """The same for NVFP4/MXFP4 GEMMs over the fp4 peak (Blackwell fp4 GEMMs reach ~1.5x the fp8
    rate on training shapes rather than 2x: block-scale loads, NVIDIA 2025 NVFP4 pretraining
    report). Literature default; fitted per stack."""
    fp8_attention: bool = False
    """The attention core runs in fp8 (Megatron --fp8-dot-product-attention, cuDNN fp8 fused
    attention); off by default in Megatron-Core and the Megatron-Bridge recipes: bf16 core."""
    fp4_bf16_edge_layers: float = 2.0
    """Layers an fp4 recipe keeps in bf16: Megatron --first-last-layers-bf16 with its defaults
    --num-layers-at-start-in-bf16 1 and --num-layers-at-end-in-bf16 1 (NVIDIA 2025, 'Pretraining
    LLMs with NVFP4', Sec. 4: the last layers are the sensitive ones)."""
    lowp_cast_bytes_per_element: float = 4.0
    """HBM bytes per element of an fp8/fp4 GEMM input for its cast, amax and transpose: bf16 read
    (2) + row-wise and column-wise low-precision copies written (1 + 1), TE's fused
    cast_transpose kernel. Charged on activation inputs (forward) and output gradients
    (backward); weights are cast once per step and cached across micro-batches."""
    fp8_saved_input_bytes_per_element: float = 1.0
    """Bytes per element of a linear's input saved for its backward under fp8: TE keeps the fp8
    (column-wise) copy it made for the weight-gradient GEMM, not the bf16 tensor."""
    fp4_saved_input_bytes_per_element: float = 0.5625
    """The same under NVFP4: 4-bit values plus one 1-byte E4M3 scale per 16 elements."""
    fp8_weight_copy_bytes_per_param: float = 2.0
    """fp8 copies of each linear weight kept beside the bf16 weight: row-wise and the transposed
    copy TE caches for the backward (Float8Tensor transpose cache; MXFP8 keeps row- and
    column-wise data the same way). Tensor-scaled fp8 on Blackwell keeps the row-wise copy
    alone, half of this (cost/precision.py ``fp8_transpose_free``)."""
    fp4_weight_copy_bytes_per_param: float = 1.125
    """NVFP4 row- and column-wise weight copies: 2 x (0.5 + 1/16 scale) bytes per parameter."""
    fp8_param_gather: bool = False
    """fp8 primary weights: the layers' linear weights live only as their fp8 copies (no bf16
    working copy beside them; the fp32 master stays in the optimizer), Megatron-Core
    ``--fp8-param-gather`` (TE ``fp8_model_init``). Megatron-Bridge's fp8 mixed-precision
    recipes set it for delayed, tensorwise (current scaling) and mxfp8, not for blockwise
    (subchannel) scaling (src/megatron/bridge/training/mixed_precision.py@0509780:
    bf16_with_fp8_current_scaling_mixed / bf16_with_mxfp8_mixed ``fp8_param_gather = True``,
    bf16_with_fp8_subchannel_scaling_mixed False). A stack field (frameworks.json)."""

    # ---- long-context attention (cost/mixers.py) -----------------------------------------
    attention_half_seq: float = 128.0
    """Sequence (KV length seen by one kernel call) at which a non-causal fused attention
    reaches half its large-sequence efficiency: efficiency x s / (s + attention_half_seq).
    FlashAttention-3 forward, H100 bf16, head dim 128, non-causal: ~500 TFLOP/s at 512, ~660 at
    16k (Shah et al. 2024, Fig. 5)."""
    attention_half_seq_causal: float = 1024.0
    """The same for a causal mask, whose diagonal tiles are partly wasted and whose early query
    blocks see few keys: FlashAttention-3 causal, head dim 128: ~200 TFLOP/s at 512, ~530 at 4k,
    ~640 at 16k (Shah et al. 2024, Fig. 5)."""
    attention_backward_ratio: float = 2.0
    """Backward over forward time of the attention core at large S (at equal efficiency): 2.0, the
    FLOP ratio the cost model uses for every op (Narayanan et al. 2021 Sec. 5.1). A hardware
    profile measures it (calib/hwcalib.py: the causal SDPA sweep, forward and backward)."""
    attention_exp_share: float = 0.40
    """Share of the fused attention kernel's forward time that waits on the softmax exponentials
    at attention_exp_reference_per_s (BMM2 waits for the SFUs: NVIDIA blog 'Making Softmax More
    Efficient with NVIDIA Blackwell Ultra', 2026). Derived: GB300's 2x SFU rate gives ~1.35x fp8
    forward on DeepSeek-V3's MLA, 1 / (1 - s + s / 2) = 1.35, s = 0.52 at 640 FLOPs per score at
    the fp8 rate; a bf16 head-dim-128 kernel does 512 FLOPs per score at half that rate (1.6x the
    MMA time), so 0.52 / (0.48 x 1.6 + 0.52) = 0.40. Used only on GPUs with an SFU rate
    (GPUSpec.sfu_exp_per_s); a GPU at the reference rate keeps its efficiency unchanged."""
    attention_backward_exp_share: float = 0.21
    """The same for the backward kernel, which recomputes one exponential per score (P) but runs
    2.5x the forward's MMA FLOPs (Dao 2023, Algorithm 2): 0.52 / (2.5 x 0.48 x 1.6 + 0.52)."""
    attention_exp_reference_per_s: float = 5e12
    """SFU rate at which the attention efficiencies that apply to SFU-rated GPUs were measured:
    B200's 5 TeraExponentials/s (FlashAttention-4 and cuDNN on B200, attention_kernels.json;
    blackwell/megatron's fitted record on B200 / GB200 rows)."""
    attention_exp_reference_head_dim: float = 128.0
    """Head dim at which attention_exp_share and attention_backward_exp_share hold (the bf16
    head-dim-128 kernel of their derivation): the exponentials per MMA FLOP scale as its ratio to
    the layer's head dim (GPT-OSS's 64: twice the share of exponentials per score's MMA)."""
    attention_backward_half_seq: float = 128.0
    """The backward kernel's own sequence falloff, as attention_half_seq (the same FlashAttention-3
    figure by default: the backward then costs attention_backward_ratio x the forward at every S)."""
    attention_backward_half_seq_causal: float = 1024.0
    """The same for a causal mask, as attention_half_seq_causal (Shah et al. 2024, Fig. 5)."""
    mamba_scan_efficiency: float = 0.05
    """Fraction of the bf16 peak the Mamba-2 SSD kernels reach on their FLOPs (cost/mixers.py):
    the chunked scan of Dao & Gu 2024 (Sec. 6-7) runs as five Triton kernels (chunk cumsum,
    chunk state, state passing, BMM, chunk scan) that write and read fp32 per-chunk states of
    n x P x N_s per chunk, small matmuls of the head dim P = 64 and the chunk Q = 128. Roofline:
    per token forward ~3.5 MFLOP over ~100 KB (x, B, C, y in bf16; the fp32 states written,
    passed and read: 3-4 x n*P*N_s*4/Q bytes), ~35 FLOP/B against a bf16 ridge of ~370 FLOP/B
    (H100; B200 alike): memory-bound at ~0.1 of peak with full bandwidth, ~0.05 with the
    backward's recomputation of the states and Triton's share of the bandwidth. Its own
    constant, fitted per (generation, stack) on the hybrid models' rows."""
    cp_causal_balanced: bool = True
    """Context parallel splits a causal sequence in 2c chunks, rank i holding chunks i and
    2c-1-i, so every rank does the same attention work (Megatron-Core's load-balanced CP, the
    'zig-zag' split). False: a contiguous split, where the last rank does (2c-1)/c of the mean."""

    # ---- MoE as it runs (cost/moe.py) ------------------------------------------------------
    moe_permute_passes: float = 1.0
    """HBM passes of the token permutation before the experts and the un-permutation (with the
    routing-probability weighting) after them: each reads and writes every routed token copy
    once (Megatron-Core / TE fused moe_permute / moe_unpermute kernels)."""
    moe_routing_imbalance: float = 1.0
    """Routed tokens of the busiest expert-parallel rank over the mean: 1 with force-balanced
    routing (Megatron --moe-router-force-load-balancing; the Megatron-Bridge benchmark rows);
    natural routing with an auxiliary loss stays 1.1-1.5x off balance per step (Fedus et al.
    2022, Switch Transformer Sec. 2.2; DeepSeek-V3 Sec. 2.1.2). The step waits for the busiest."""
    moe_grouped_gemm_half_dim: float = 128.0
    """matmul_half_dim of the experts' grouped GEMMs: the efficiency curve of cost/gemm.py with
    this half dimension, seen by the tokens per expert (the m of each group member) and the
    expert widths. A grouped GEMM (TE/cuBLASLt grouped GEMM, CUTLASS grouped kernels) pays a
    partial wave per expert and cannot pick one tile shape for all members, so its falloff with
    small per-expert batches is steeper than a single GEMM's (Megatron-Core MoE docs, 'grouped
    GEMM': efficiency grows with tokens per expert). Default: the dense GEMM's 128 (no extra
    falloff); fitted per (generation, stack)."""
    moe_grouped_gemm_efficiency: float = 1.0
    """Large-shape efficiency of the experts' grouped GEMMs over a single GEMM's
    ``matmul_efficiency``: TE's GroupedLinear runs the local experts' GEMMs as a sequence of
    cuBLASLt calls (general_grouped_gemm over the m_splits), each with its own fp8 casts and
    scaling epilogue, that a dense GEMM of the layer does not pay. A MoE-only constant, so that
    dense rows never pay a cost fitted on MoE rows, nor MoE rows move the dense GEMM efficiency
    (bench/bench_holdout_drift.py). Default 1: no difference; fitted per (generation, stack) on
    the MoE rows; not applied to one fused grouped kernel (``moe_fused_grouped_mlp``)."""
    moe_alltoall_sync_s: float = 1.0e-3
    """Host time to launch a MoE layer's forward after the dropless all-to-all dispatcher's
    device-to-host sync of the tokens-per-expert counts (the backward, like all of the layer's
    work, 2x). Megatron-Core's MoEAlltoAllTokenDispatcher and torchtitan's expert-parallel
    all-to-all move the counts to the host to size the all-to-all: the launch queue drains,
    and the layer's remaining ~100 kernels (permute, grouped GEMMs, activation, unpermute,
    combine) start from the host at ~10 us of launch and dispatch each (5-20 us: PyTorch blog
    'Accelerating PyTorch with CUDA Graphs', 2021). Host and device then run concurrently up to
    the next MoE layer's sync, the host launching this layer's experts and the next layer's norm,
    attention and router: a MoE layer's forward takes max(its device time, this launch time)
    (cost/layer.py): a small, fine-grained MoE at micro-batch 1 is host-bound, a large one hides
    the launches behind its GEMMs. 0 with CUDA graphs / a sync-free dispatcher; fitted per stack."""
    moe_expert_gemm_s: float = 0.0
    """Fixed device time of each local expert's GEMM beyond its FLOPs, forward, per GEMM (two per
    expert: up and down; the backward 2x like all of the layer's work): Transformer Engine's
    GroupedLinear (Megatron-Core --moe-grouped-gemm) runs one GEMM per local expert
    (general_grouped_gemm over the m_splits, with each split's fp8 cast), each with its launch and
    its last partial wave, so a layer with E/ep local experts pays 2 E/ep of them whatever the
    tokens: many small local experts (ep 8 of 128) cost more than few large ones. 0: a single
    grouped kernel; fitted per (generation, stack)."""

    # ---- communication ------------------------------------------------------------------
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

    # ---- memory -------------------------------------------------------------------------
    weight_bytes_per_param: float = 2.0
    """bf16/fp16 working copy of each weight."""
    grad_bytes_per_param_bf16: float = 4.0
    """Gradient buffer per parameter under bf16 (and fp8) training: accumulated and reduced in
    fp32 (Megatron-LM forces accumulate_allreduce_grads_in_fp32 with bf16; torchtitan reduces
    in fp32; DeepSpeed's BF16_Optimizer keeps fp32 gradients)."""
    grad_bytes_per_param_fp16: float = 2.0
    """Gradient buffer per parameter under fp16 training: fp16, reduced in fp16 (Megatron-LM's
    default without --accumulate-allreduce-grads-in-fp32; DeepSpeed fp16 ZeRO-1)."""
    master_bytes_per_param: float = 4.0
    """fp32 master weights under mixed precision (Micikevicius et al. 2018)."""
    adam_bytes_per_param: float = 8.0
    """Adam first and second moments in fp32 (Rajbhandari et al. 2020, ZeRO Sec. 3.1)."""
    sgd_bytes_per_param: float = 4.0
    """SGD momentum in fp32."""
    logits_bytes_per_element: float = 6.0
    """LM-head logits (S*b*V/t elements per micro-batch) kept for the loss: fp16/bf16 output
    plus the fp32 softmax copy of Megatron's vocab-parallel cross entropy (2 + 4 bytes)."""
    loss_transient_bytes_per_element: float = 0.0
    """Extra bytes per logit element alive only around the loss forward/backward (fp32
    temporaries of the cross entropy: the upcast logits before the in-place exp, and the fp32
    gradient of the logits before its cast back, Megatron-LM cross_entropy.py); matters at
    V = 250k. Counted on the LM-head rank on top of the kept activations."""
    pp_preallocated_recv_buffers: bool = False
    """Whether the stack's pipeline stages allocate a receive buffer per micro-batch up front and keep
    them for the step: torch.distributed.pipelining does (meshplan's runtime and torchtitan; measured
    by the dry run, docs/dryrun.md: 1.9 GiB on a llama3-70b interleaved rank); Megatron-Core receives
    into a fresh tensor per transfer (p2p_communication.py), the default here."""
    moe_routed_copies_kept: float = 2.0
    """(T*k, D) tensors an MoE layer keeps for backward beyond the experts' F-wide ones, in 16-bit
    elements: the permuted tokens the experts' first linear keeps (its input) and the experts'
    output the combine's multiply by the routing probability keeps (for the probability's
    gradient). meshplan's runtime keeps both (dry run's attribution, docs/dryrun.md, 2026-11-24),
    as Megatron-Core's permute/unpermute do (moe_utils.py)."""
    framework_overhead_gib: float = 3.0
    """What the stack holds beyond the model's tensors and the buffers counted here: cuBLAS and
    attention workspaces, the stack's own buffers (typical 1-3 GiB per GPU, PyTorch CUDA notes;
    fitted per (generation, stack) where rows measure memory). Part of the peak reserved, on which
    ``fits`` is decided; the dry run and the runtime's GPU prediction leave it out as no tensor.
    The CUDA context and NCCL's buffers, outside the caching allocator, are counted apart in the
    device total only (``cuda_context_gib``, ``nccl_*``; cost/device_memory.py)."""
    cuda_context_gib: float = 0.27
    """CUDA context of a torch process and the kernel images it loads, outside the caching
    allocator (in nvidia-smi's figure, not in torch.cuda.max_memory_reserved): 287,047,680 bytes
    with lazy module loading (CUDA >= 11.7; torch sets CUDA_MODULE_LOADING=LAZY since 1.13),
    666,632,192 bytes with eager loading (pytorch/pytorch#86509). Libraries built before CUDA
    11.7 load eagerly: the stacks of that time set the eager figure (frameworks.json)."""
    nccl_buffer_bytes: float = 4 * 1024**2
    """NCCL's buffer per connection for its Simple protocol: NCCL_BUFFSIZE, 4 MiB by default
    (NCCL user guide, Environment Variables); allocated by NCCL, outside the caching allocator."""
    nccl_channels: float = 16.0
    """Channels per NCCL communicator (NCCL_MIN/MAX_NCHANNELS bound it, at most 32; NCCL picks the
    count from the topology and logs it under NCCL_DEBUG=INFO): an assumption within that range."""
    nccl_peers_per_channel: float = 2.0
    """Connections per channel whose buffers a rank holds: the ring's previous and next rank."""
    allocator_fragmentation: float = 0.05
    """Fraction of allocated memory lost to caching-allocator fragmentation (PyTorch CUDA
    caching allocator notes), charged on the states, activations and the optimizer step's copies
    (cost/memory.py ``rank_other``): the reserve, the peak reserved less the peak allocated."""
    allocator_expandable_segments: bool = False
    """Whether the run set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. The peak
    reserved is the same figure, but before the allocator reports out of memory it unmaps the
    free pages of every expandable segment (c10/cuda/CUDACachingAllocator.cpp,
    ``release_cached_blocks`` -> ``release_blocks`` -> ``unmap_block``; pytorch/pytorch PR
    #96995), where the default allocator can free only a segment with no live block. So the
    reserve is given back under pressure and what must fit the GPU is the allocated peak
    (cost/device_memory.py: ``held_peak_bytes``), up to the page rounding at the edges of free
    blocks (2 MiB pages), left out; the search's reserved limit stays the conservative one.
    A run setting: Megatron-Bridge's performance launcher sets it for Llama 3.1 405B FP8 (cs,
    mx) and dropless DeepSeek-V3 BF16 on GB200 / GB300 ('OOM if not set';
    scripts/performance/setup_experiment.py@0132842, spec/presets/stack_releases.json), its
    Slurm executor for no other run (scripts/performance/utils/executors.py@f02b14e,
    PERF_ENV_VARS); torchtitan's launcher for every run (run_train.sh@0168bd5
    ``PYTORCH_ALLOC_CONF``); meshplan's own launcher for every rank (meshplan/launch_env.py, the
    meshplan stack's value: cost/calib_records.py ``launcher_values``)."""
    cp_ring_gathers_kv: bool = False
    """Whether context parallel runs as torch's ring attention (torchtitan): it all-gathers the
    whole sequence's K and V in each attention call and accumulates the backward's gradients in
    fp32 (pytorch/pytorch torch/distributed/tensor/experimental/_attention.py@f2127db,
    rotate_method ALL_GATHER, convert_to_f32), a transient per attention layer charged by
    cost/cp_ring_memory.py; False: Megatron-Core / TE's p2p ring, two K/V chunks in flight."""
    comm_bucket_bytes: float = 0.1 * 1024**3
    """Reducer/FSDP communication buckets (DDP bucket_cap_mb=25 x a few; FSDP prefetch)."""
    sp_saves_gathered_inputs: bool = False
    """Under sequence parallel, whether each column-parallel linear (q/k/v, the MLP's up
    projections, the LM head) keeps its all-gathered input (T x D, not T/t x D) for its backward:
    DTensor's tensor parallel does (torch.distributed.tensor.parallel: PrepareModuleInput / ColwiseParallel
    redistribute the sequence shard to Replicate, and the linear saves what it received); Megatron
    keeps the shard and gathers it again in the backward (Korthikanti et al. 2022, Sec. 4.2.2), the
    default, and so does meshplan's runtime (runtime/sp_regather.py: saved-tensor hooks). A stack
    field (torchtitan: frameworks.json)."""
    loss_parallel_transient_bytes_per_element: float = 0.0
    """With tp > 1, bytes per logit element the vocabulary-parallel loss holds beyond
    ``loss_transient_bytes_per_element``: torch's loss_parallel (torch.distributed.tensor.parallel
    .loss ``_log_softmax``, the log_softmax decomposition with all-reduces inserted) keeps the fp32
    shifted logits and their exp at once where the fused kernel writes only its output: 4 more.
    A stack field (torchtitan, whose loss parallel is on by default: frameworks.json)."""
    fp16_step_grad_copy_bytes_per_param: float = 0.0
    """fp16 training without ZeRO: bytes per parameter the optimizer step allocates beside the
    kept states while it runs (the gradients' fp32 copy it steps on). DeepSpeed's FP16_Optimizer
    (runtime/fp16/fused_optimizer.py, step) casts every fp16 gradient to fp32 (4) and flattens
    them into one fp32 buffer (4) while the fp16 gradients are still held: 8. The optimizer step
    runs after the last backward, with no activations alive: the peak is the larger of the two.
    0: the stack keeps no such copy (a stack field)."""
    fp16_zero_step_grad_copy_bytes_per_param: float = 0.0
    """The same under ZeRO 1/2, per parameter of the rank's optimizer partition: DeepSpeed's
    stage_1_and_2.py step frees the gradients outside the partition, flattens the partition's in
    fp16 (2) and casts that to fp32 (4): 6. 0: no such copy, nothing freed (a stack field)."""
    fsdp_pp_keeps_unsharded: bool = True
    """With pipeline parallelism, FSDP does not reshard a stage's parameters after the forward
    (torchtitan's default reshard_after_forward policy under PP: the backward of in-flight
    micro-batches would gather them again), so a rank holds its whole stage unsharded. A stack
    field (meshplan's runtime reshards after forward and backward: runtime/pipeline.py ZeroStage)."""
    fsdp_pp_accumulates_unsharded_grads: bool = False
    """With pipeline parallelism, FSDP accumulates each micro-batch's gradients unsharded in the
    reduce dtype and reduce-scatters once after the last backward (torch.distributed.pipelining's
    PipelineStage turns off gradient sync and resharding after backward until then), so a rank
    holds its whole stage's gradients unsharded beside the gathered weights. A stack field."""
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
    Set per row by a Megatron-Bridge preset that runs HybridEP (calib/recipes.py
    HYBRIDEP_NVLINK_EFFICIENCY): TMA copies over NVLink that saturate it with 4-16 SMs (NVIDIA
    Technical Blog, 'Optimizing Communication for Mixture-of-Experts Training with Hybrid Expert
    Parallel', 2026-02-02)."""
    moe_flex_host_sync: bool = False
    """Under the flex dispatcher, the dispatch still waits on the host once per MoE layer for the
    received token counts (``moe_alltoall_sync_s`` charged as for the dropless alltoall
    dispatcher): DeepEP's normal kernels, whose notify step has "the CPU ... wait for GPU's signal
    to arrive" (Megatron-Core moe/fused_a2a.py; DeepEP README, normal kernels: "CPU-GPU
    synchronization"). False: HybridEP, which sizes its buffers on the device. Set per row by a
    Megatron-Bridge preset that runs DeepEP (calib/recipes.py)."""
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

    # ---- behaviour ------------------------------------------------------------------------
    def grad_bytes_per_param(self, precision: Precision) -> float:
        """Bytes of one gradient element for this compute precision (fp32 training: 4)."""
        if precision == Precision.FP16:
            return self.grad_bytes_per_param_fp16
        if precision == Precision.FP32:
            return 4.0
        return self.grad_bytes_per_param_bf16

    def collective_factors(self, op: str) -> tuple[float, float]:
        """(latency factor, bandwidth factor) of a collective op ('all_reduce', 'all_gather',
        'reduce_scatter', 'all_to_all', 'send_recv', 'tp_all_gather', 'tp_reduce_scatter'; the
        names of meshplan.calib.hwfit.CollectiveOp)."""
        if not hasattr(self, f"{op}_latency_factor"):
            raise MeshplanError(f"unknown collective {op!r}")
        return getattr(self, f"{op}_latency_factor"), getattr(self, f"{op}_bandwidth_factor")

    def replace_fields(self, **changes: Any) -> "Calibration":
        known = {f.name for f in fields(self)}
        extra = set(changes) - known
        if extra:
            raise MeshplanError(f"unknown calibration field(s): {', '.join(sorted(extra))}")
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Calibration":
        if not isinstance(data, dict):
            raise MeshplanError("calibration must be a mapping")
        return cls().replace_fields(**data)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("source", "attention_kernel") or isinstance(v, bool):
                continue
            if not isinstance(v, (int, float)) or v < 0:
                raise MeshplanError(f"calibration {f.name} must be a non-negative number, got {v!r}")
        check_kernel(self.attention_kernel)
        for share in ("attention_exp_share", "attention_backward_exp_share"):
            if getattr(self, share) > 1:
                raise MeshplanError(f"calibration {share} must be a share in [0, 1], got {getattr(self, share)!r}")
        if self.fp8_matmul_factor <= 0 or self.fp4_matmul_factor <= 0:
            raise MeshplanError("calibration fp8_matmul_factor and fp4_matmul_factor must be > 0")
        if self.moe_routing_imbalance < 1:
            raise MeshplanError(f"calibration moe_routing_imbalance must be >= 1, got {self.moe_routing_imbalance!r}")
        for f in ("matmul_efficiency", "attention_efficiency", "hbm_efficiency",
                  "intra_node_comm_efficiency", "inter_node_comm_efficiency", "moe_grouped_gemm_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise MeshplanError(f"calibration {f} must be in (0, 1], got {getattr(self, f)!r}")
        for f in (f.name for f in fields(self) if f.name.endswith("_bandwidth_factor")):
            if not getattr(self, f) > 0:
                raise MeshplanError(f"calibration {f} must be > 0, got {getattr(self, f)!r}")
        for f in ("tp_overlap", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap",
                  "pp_p2p_overlap", "zero_bubble_residual", "unaligned_matmul_factor",
                  "fp8_matmul_factor", "fp4_matmul_factor", "ring_nic_spread",
                  "moe_dispatch_nvlink_efficiency"):
            if not 0 <= getattr(self, f) <= 1:
                raise MeshplanError(f"calibration {f} must be in [0, 1], got {getattr(self, f)!r}")


STACK_FIELDS = ("tp_overlap", "tp_backward_async", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap",
                "pp_p2p_overlap", "zero_bubble_residual", "layer_overhead_s", "microbatch_overhead_s",
                "loss_transient_bytes_per_element", "host_s_per_kernel", "host_fused_kernels", "eager_memory_passes",
                "logits_bytes_per_element",
                "fsdp_pp_keeps_unsharded", "fsdp_pp_accumulates_unsharded_grads", "zero_bubble_keeps_unsharded",
                "op_selective_recompute",
                "fp8_weight_copy_bytes_per_param", "fp8_saved_input_bytes_per_element", "fp8_param_gather",
                "attention_kernel",
                "pp_preallocated_recv_buffers", "cuda_graph_full_iteration", "moe_fused_grouped_mlp",
                "allocator_expandable_segments", "cp_ring_gathers_kv", "fp16_step_grad_copy_bytes_per_param",
                "fp16_zero_step_grad_copy_bytes_per_param", "sp_saves_gathered_inputs",
                "loss_parallel_transient_bytes_per_element")
"""Fields that describe how a stack runs a plan (what it overlaps, its host work), not the
hardware: never borrowed from another stack's record."""


@lru_cache(maxsize=1)
def fitted_records() -> Mapping[str, FittedRecord]:
    """The fitted records by 'generation/stack' (``FITTED_FILE``), each checked against Calibration."""
    out = read_fitted_records()
    for record in out.values():
        Calibration().replace_fields(**record.values)  # an unknown field or a bad value fails here
    return MappingProxyType(out)


@lru_cache(maxsize=1)
def stack_records() -> Mapping[str, StackRecord]:
    """Each stack's mechanisms (``FITTED_FILE`` 'stacks'), checked against Calibration."""
    out = read_stack_records()
    for stack, record in out.items():
        bad = set(record.values) - set(STACK_FIELDS)
        if bad:
            raise MeshplanError(f"{FITTED_FILE}: stack {stack}: not stack fields: {', '.join(sorted(bad))}")
        Calibration().replace_fields(**record.values)
    return MappingProxyType(out)


def stack_names() -> tuple[str, ...]:
    return tuple(stack_records())


def calibration_for(gpu: GPUSpec, stack: str | None = None) -> Calibration:
    """The calibration of ``stack`` (default: meshplan's runtime) on ``gpu``'s generation:
    defaults, then, when this pair has no record, the hardware fields of a record borrowed from
    another stack of the same generation (else the GEMM fields carried from another generation's
    record, cost/generation_transfer.py) and the attention efficiency of the stack's kernel on
    this generation (cost/attention_kernels.py), then the stack's mechanisms, then the pair's
    own record (cost/stack_resolution.py)."""
    resolved = resolve_calibration(gpu_generation(gpu), (stack or DEFAULT_STACK).lower(), fitted=fitted_records(),
                                   stacks=stack_records(), lenders=lender_keys(), stack_fields=STACK_FIELDS,
                                   default_kernel=Calibration().attention_kernel, transfers=generation_transfers())
    return Calibration().replace_fields(**{**resolved.values, "source": resolved.source})
