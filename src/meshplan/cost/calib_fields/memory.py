"""Memory factors of :class:`~meshplan.cost.calibration.Calibration`: bytes per parameter
and per element, framework/context/NCCL/allocator overheads, transient copies.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemoryFields"]


@dataclass(frozen=True, kw_only=True)
class MemoryFields:
    """Bytes per parameter and element, fixed device overheads, allocator and transients."""

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
    fsdp_reduce_scatter_bytes_per_param: float = 0.0
    """Bytes per parameter of one layer that ZeRO-3 holds in its backward for the gradients'
    reduce-scatter, beyond the gathered layers: FSDP2 with a wider ``reduce_dtype`` (torchtitan:
    bf16 compute, fp32 reduce) allocates the reduce-scatter input in fp32 for the whole layer (4)
    and copies the layer's unsharded bf16 gradients (2) into it before freeing them; the input is
    held until the next layer's reduce-scatter, while that layer's bf16 gradients are produced
    (pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py@010ae4a
    ``foreach_reduce``: ``reduce_scatter_comm.allocate(..., dtype=reduce_dtype)``, "Only after the
    copy-in finishes can we free the gradients"): 2 + 4 = 6 at either moment. 0: not counted
    (a stack field, frameworks.json; cost/memory.py ``rank_other``)."""
    fsdp_root_gathered_in_backward: bool = False
    """Whether ZeRO-3 holds the rank's parameters outside its layers (embedding, final norm, LM
    head: FSDP's root unit) gathered through the whole backward, beside the two gathered layers,
    and the LM head's 16-bit gradient with them (V/t x D at 2 bytes). torch FSDP2 frees the root
    unit after forward when ``reshard_after_forward`` is passed (only its default skips that for
    the root: torch 2.13 _fsdp_state.py ``_lazy_init``), gathers it again for the LM head's
    backward, the first, and frees it, reduce-scattering the head's gradient made there, in its
    post-backward, after the embedding's backward, the last. meshplan's runtime does this
    (runtime/parallelize.py ``apply_dp`` wraps the model last with the plan's reshard;
    meshplan/fsdp_policy.py); measured on the README plan's dry run (docs/dryrun.md: 1.96 GiB
    gathered, 0.98 GiB of the head's gradient). torchtitan of 2024-25 wraps its root the same way
    (``fully_shard(model, reshard_after_forward=not pp_enabled)``), not set for that stack here
    (not measured); False: the embedding and the head are units of their own, freed around their
    own passes, or the stack gathers module by module (DeepSpeed). Where set, these buffers and the
    layer's reduce-scatter input (``fsdp_reduce_scatter_bytes_per_param``), all alive only after
    the loss's backward has freed the logits and their transients, add what exceeds the logits
    term (a phase maximum). A stack field; cost/memory.py ``rank_other``."""
    zero3_max_live_params: float = 0.0
    """Elements of gathered parameters a rank keeps live under ZeRO-3 before it releases any:
    DeepSpeed's ``stage3_max_live_parameters`` (default 1e9, deepspeed/runtime/zero/config.py
    @1b88ac3). DeepSpeed gathers module by module (each Linear a submodule), not layer by layer,
    and its prefetch adds up to a bucket (``zero3_prefetch_bucket_params``) ahead at every module
    while the window stays under this cap (partitioned_param_coordinator.py@00a31c9
    fetch_sub_module: ``min(max_n_available_params - n_available_params, prefetch_bucket_sz)``,
    whole parameters until the bucket is full). 0: torch FSDP's two layers gathered (Zhao et al.
    2023 Sec. 3.2). A stack field (frameworks.json); cost/memory.py ``rank_other``."""
    zero3_prefetch_bucket_params: float = 5e7
    """DeepSpeed's ``stage3_prefetch_bucket_size`` (elements; default 5e7, config.py@1b88ac3):
    where a module is smaller, the prefetch runs ahead until the window reaches
    ``zero3_max_live_params``; where it is larger, one whole module is prefetched beside the
    current one. Read only where ``zero3_max_live_params`` is set."""
    params_are_master: bool = False
    """Whether the stack's parameter is the fp32 master itself, with no persistent low-precision
    copy: torch FSDP1 / FSDP2 with a bf16 ``param_dtype`` keep the fp32 sharded parameter, cast a
    layer's all-gather input to bf16 on the fly and hold bf16 only unsharded, while the layer is
    gathered (pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_api.py@05f814f
    MixedPrecisionPolicy: "FSDP ... keeps the high-precision sharded parameters in memory anyway"
    and needs no extra copy for the optimizer step). States per parameter: 4 (the fp32
    parameter, counted as the weights) + the gradients + the moments, no 2-byte shard and no
    separate master (16 B with fp32 Adam and fp32 sharded gradients, not 2 + 4 + 12).
    False: a low-precision parameter beside the fp32 master (Megatron's distributed optimizer:
    bf16 parameters, fp32 main parameters; DeepSpeed ZeRO: bf16 partitioned parameters and an
    fp32 partition). A stack field (frameworks.json); cost/memory.py ``rank_states``."""
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
    pp_kept_output_bytes_per_element: float = 0.0
    """Bytes per logit element (S*b*V/t a micro-batch) of the last pipeline stage's output that the
    stack keeps for every micro-batch until the step ends. torch.distributed.pipelining before its
    ``return_outputs`` switch appends each micro-batch's stage output to ``output_chunks`` "for final
    output merge or reduction" (stage.py ``forward_one_chunk``), and once that micro-batch's backward
    has run only detaches it (pytorch/pytorch #138504, 2024-10: the graph is freed, the tensor is
    not); the schedule merges them after the last backward (schedules.py ``step`` ->
    ``_merge_outputs``). So the last rank holds all m outputs (pytorch/pytorch #153383, 2025-05,
    stopped the other stages keeping theirs). torchtitan of 2024-12 (torch 1963fc8) ran this with
    its llama model's bf16 logits as the output (pytorch/torchtitan #642, 2024-10, moved the
    ``.float()`` of ``self.output(h)`` into the loss): 2 bytes (frameworks.json). In-flight
    micro-batches' outputs are among the m (the schedule's ``fwd_cache`` holds the same tensor).
    0 where nothing is kept: meshplan's runtime steps with ``return_outputs=False`` (runtime/
    pipeline.py; torch 2.13 stage.py keeps an output only ``if self.is_last and
    save_forward_output``), as torchtitan's trainer does since; Megatron-Core keeps none."""
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
    cp_ring_score_tile_rows: float = 0.0
    """Query rows per fp32 score tile where the stack's ring attention computes its blocks in
    eager torch (meshplan's runtime: runtime/ring_attention.py, meshplan/ring_policy.py
    QUERY_CHUNK_ROWS = 1024; the stack record reads it there): one layer's backward holds
    ``cp_ring_backward_live_tiles`` tiles of (b, N/t heads, rows, S/c keys) fp32, with its fp32 dQ
    and dO (cost/cp_ring_memory.py). 0: the ring runs a fused kernel whose tiles stay on chip
    (FlashAttention, Dao et al. 2022, Sec. 3.1; Megatron-Core / TE, torch's SDPA in torchtitan)."""
    cp_ring_backward_live_tiles: float = 0.0
    """fp32 score tiles live at once in such a ring's backward (meshplan's: 2, P and dS;
    meshplan/ring_policy.py BACKWARD_LIVE_TILES); read only where cp_ring_score_tile_rows > 0."""
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
