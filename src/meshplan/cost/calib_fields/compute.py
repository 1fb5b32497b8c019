"""Compute factors of :class:`~meshplan.cost.calibration.Calibration`: GEMM and attention
efficiency, host overheads per layer and per kernel, memory-bound passes.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ComputeFields"]


@dataclass(frozen=True, kw_only=True)
class ComputeFields:
    """GEMM, attention-kernel and memory-bound efficiency, and the fixed host costs."""

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
    latency of the layer's TP collectives beyond the alpha term. Added to the layer's device time
    (forward 1x, backward 2x), so amortised by larger micro-batches whatever the layer's size;
    with ``layer_overhead_on_host`` a host cost instead. Not charged under
    ``cuda_graph_full_iteration`` (cost/layer.py: the replayed graph issues no launch)."""
    layer_overhead_on_host: bool = False
    """``layer_overhead_s`` as host time on a GPU, spent while the device runs the queue (PyTorch
    CUDA semantics, 'Asynchronous execution'): a layer takes max(device time, overhead) forward
    and max(device time, 2x overhead) backward (cost/layer.py; the launch bound of cost/host.py),
    so it slows only layers shorter than it (a small model, a small micro-batch, a fast GPU) and
    a large layer hides it at any micro-batch. Never on a CPU device (host and device one). Off:
    with it on and a refit, Megatron-Bridge validate goes 5.6% / 20.1% -> 4.8% / 23.6% (median /
    p90), held-out 7.2 / 19.0 -> 7.1 / 18.3, the measured micro-batch pairs' ratio error 8.2% ->
    1.7%, but 4 of 5 tp+cp pairs misordered (docs/accuracy.md, session 10). With it on and a
    per-token memory-bound factor free instead (bench/bench_overhead_per_token.py), the Blackwell
    fit drops the per-layer cost for elementwise_time_factor 2.5 (micro-batch pairs 8.9% -> 1.3%)
    but the p90 goes 20.8% -> 24.1% (Nemotron-3-Super GB200 tp2 mb1 +38..46%): still off."""
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
    host_kernels_by_op: bool = False
    """Count in a layer's host launches (cost/host.py ``op_kernels``) the kernels its ops add: the
    quantize kernels of each fp8 / fp4 GEMM operand per recipe (amax, scale, cast, Hadamard
    transform: Transformer Engine) and the MoE block's router, dispatcher, permute and grouped
    expert kernels (Megatron-Core). A stack field; off: the math kernels only. Off because with
    it and ``layer_overhead_on_host`` on and a full refit, Megatron-Bridge validate goes 5.4% /
    20.8% -> 5.0% / 21.7% (median / p90), the four tp+cp pairs misordered, held-out 7.1% / 18.8%
    -> 7.9% / 20.7%, with the launch cost at its range's top on Blackwell (40 us); it keeps fp4
    (-0.8%) and Nemotron-3-Super where session 10's flat host overhead lost them, and the
    micro-batch pairs at 1.1% (docs/accuracy.md, session 11, bench/bench_host_pacing.py)."""
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
    repeat_kv_copy: bool = False
    """The model code materialises K and V repeated to every query head before attention
    (torchtitan's llama3 ``repeat_kv``: ``unsqueeze`` / ``expand`` / ``reshape`` of each, then
    SDPA on equal head counts) and the stack runs it compiled: the reshape of an expanded tensor
    is no view, so TorchInductor writes the repeated copy before SDPA, an extern kernel that reads
    dense tensors, and the backward sums the copies' gradients back (one pass each way, as the
    eager count of cost/eager_passes.py ``repeat_kv_bytes``, which eager runs already charge).
    Stacks whose attention takes grouped K/V natively (TE / cuDNN, SDPA's ``enable_gqa``,
    flash-attn) make no copy. A stack field (frameworks.json: torchtitan-compile)."""
    elementwise_time_factor: float = 1.0
    """Time of a layer's memory-bound ops (norms, residual adds, activation function) over their
    bytes / (W_hbm * hbm_efficiency), the one-pass-per-op count of fused kernels (Megatron/TE,
    torch.compile): 1. Eager PyTorch runs more passes (rotary embedding, GQA's repeated K/V, the
    saved tensors of autograd); a CPU profile measures meshplan's runtime modules (the
    elementwise probe, meshplan.calib.layer_probe)."""
    attention_efficiency: float = 0.55
    """Fraction of peak reached by the attention core (FlashAttention-2 reaches 50-73% of A100
    peak forward+backward, Dao 2023 Sec. 4.1). Every (generation, stack) starts from the table of
    its stack's attention_kernel (cost/attention_kernels.py: FlashAttention-2 reaches 35% of H100,
    FA3 / cuDNN ~60%, cuDNN 44% of B200), and so does its fit (calib/fit.py fit_start); a fitted
    record's value wins only where the fit moved it."""
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
