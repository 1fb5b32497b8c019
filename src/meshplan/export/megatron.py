"""Job -> Megatron-LM ``pretrain_gpt.py`` command-line arguments.

Option names checked against megatron/training/arguments.py (NVIDIA/Megatron-LM, see
docs/interop.md). Megatron derives the data-parallel size from the world size, so it is not an
argument; the distributed optimizer (ZeRO-1) shards over all data-parallel x context-parallel
ranks unless
``--num-distributed-optimizer-instances`` keeps several copies (meshplan's dp_replicate).
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.export.base import Export, ExportTarget, refuse_data_schedule, refuse_expert_placement, uniform_recompute
from meshplan.export.osdp import osdp_notation, uses_osdp
from meshplan.launch_env import env_assignments
from meshplan.plan import (CPMethod, Job, Offload, Recompute, Schedule, embedding_loss_split, even_split,
                           format_layout)
from meshplan.spec.model import Arch, ModelSpec, Norm, Position
from meshplan.spec.training import MoeDispatcher, Precision, Recipe, TrainingSpec

_PRECISION_FLAGS = {
    Precision.BF16: ["--bf16"],
    Precision.FP16: ["--fp16"],
    # fp8/fp4 GEMMs via Transformer Engine, bf16 elsewhere: E4M3 forward, E5M2 gradients
    # ("hybrid"); fp4 is E2M1 with the recipe's block scales.
    Precision.FP8: ["--bf16", "--fp8-format", "hybrid"],
    Precision.FP4: ["--bf16", "--fp4-format", "e2m1"],
    Precision.FP32: [],
}
_RECIPE_FLAGS = {
    Recipe.DELAYED: ["--fp8-recipe", "delayed"],
    Recipe.TENSORWISE: ["--fp8-recipe", "tensorwise"],
    Recipe.BLOCKWISE: ["--fp8-recipe", "blockwise"],
    Recipe.MXFP8: ["--fp8-recipe", "mxfp8"],
    Recipe.NVFP4: ["--fp4-recipe", "nvfp4"],
}
"""Megatron-Core's --fp8-recipe / --fp4-recipe choices (megatron/training/arguments.py); it has
no rowwise fp8 (a torchao recipe) and no MXFP4 training recipe."""


def _precision_args(t: TrainingSpec) -> list[str]:
    if t.recipe is not None and t.recipe not in _RECIPE_FLAGS:
        raise MeshplanError(f"Megatron-Core has no {t.recipe.value} recipe (it runs "
                            f"{', '.join(r.value for r in _RECIPE_FLAGS)}); choose one of those")
    return _PRECISION_FLAGS[t.precision] + (_RECIPE_FLAGS[t.recipe] if t.recipe else [])


def _moe_args(m: ModelSpec, t: TrainingSpec) -> list[list[str]]:
    """How an MoE layer runs its experts, moves and drops tokens (megatron/training/
    arguments.py@000c4ac, _add_moe_args). The dispatcher is always written: Megatron-LM's default
    is allgather, the plan's is its own. A capacity factor is written with
    --moe-pad-expert-input-to-capacity, as the cost model reads it (fixed-size expert inputs, no
    host sync: cost/layer.py)."""
    if not m.is_moe:
        return []
    # the experts as grouped GEMMs (TEGroupedMLP), as the cost model prices them
    # (Calibration.moe_grouped_gemm_*); Megatron-LM's default is one GEMM per local expert
    out = [["--moe-grouped-gemm"], ["--moe-token-dispatcher-type", t.moe_dispatcher.value]]
    if t.moe_dispatcher == MoeDispatcher.FLEX:  # "Only works with flex token dispatcher" (its help)
        out.append(["--moe-enable-deepep"])
    if t.moe_capacity_factor is not None:
        out += [["--moe-expert-capacity-factor", str(float(t.moe_capacity_factor))],
                ["--moe-pad-expert-input-to-capacity"]]
    return out


def _model_args(m: ModelSpec, seq_len: int, warnings: list[str]) -> list[list[str]]:
    args = [
        ["--num-layers", str(m.num_layers)],
        ["--hidden-size", str(m.hidden_size)],
        ["--ffn-hidden-size", str(m.ffn_hidden_size)],
        ["--num-attention-heads", str(m.num_heads)],
    ]
    if m.num_kv_heads != m.num_heads:
        args.append(["--group-query-attention"])
        args.append(["--num-query-groups", str(m.num_kv_heads)])
    if m.head_dim != m.hidden_size // m.num_heads or m.hidden_size % m.num_heads:
        args.append(["--kv-channels", str(m.head_dim)])
    # Megatron checks max_position_embeddings >= seq_length; RoPE has no table, so any bound works
    max_pos = max(m.max_position, seq_len) if m.position == Position.ROPE else m.max_position
    args.append(["--max-position-embeddings", str(max_pos)])
    # Megatron takes the vocabulary from its tokenizer; --vocab-size is read with NullTokenizer.
    args.append(["--vocab-size", str(m.vocab_size)])
    args.append(["--position-embedding-type", "rope" if m.position == Position.ROPE else "learned_absolute"])
    args.append(["--normalization", "RMSNorm" if m.norm == Norm.RMSNORM else "LayerNorm"])
    if m.gated_mlp:
        args.append(["--swiglu"])
    if not m.tied_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    # Megatron: --disable-bias-linear drops every linear bias; --add-qkv-bias puts back q/k/v's.
    if not m.mlp_bias:
        args.append(["--disable-bias-linear"])
        if m.attn_bias:
            args.append(["--add-qkv-bias"])
    elif not m.attn_bias:
        warnings.append("Megatron cannot drop only the q/k/v bias: exported with every linear bias")
    if m.arch == Arch.ENCODER:
        warnings.append("encoder model: these arguments are for pretrain_bert.py, not pretrain_gpt.py")
    if m.is_moe:
        args.append(["--num-experts", str(m.moe_num_experts)])
        args.append(["--moe-router-topk", str(m.moe_top_k)])
        args.append(["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)])
        if m.moe_shared_experts:
            args.append(["--moe-shared-expert-intermediate-size",
                         str(m.moe_shared_experts * m.moe_shared_ffn_hidden_size)])
        if m.moe_dense_layers:
            args.append(["--moe-layer-freq",
                         f"[0]*{m.moe_dense_layers}+[1]*{m.num_layers - m.moe_dense_layers}"])
        if m.moe_latent_size:
            args.append(["--moe-latent-size", str(m.moe_latent_size)])
    return args + _layout_args(m, warnings)


def _layout_args(m: ModelSpec, warnings: list[str]) -> list[list[str]]:
    """MLA, QK-norm, sliding windows and sinks, MTP and hybrid Mamba stacks (Megatron-LM flags)."""
    args: list[list[str]] = []
    if m.is_mla:
        args += [["--multi-latent-attention"], ["--kv-lora-rank", str(m.kv_lora_rank)],
                 ["--qk-head-dim", str(m.qk_nope_head_dim)], ["--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)],
                 ["--v-head-dim", str(m.v_head_dim)]]
        if m.q_lora_rank:
            args.append(["--q-lora-rank", str(m.q_lora_rank)])
    if m.qk_norm or m.is_mla:  # Megatron's MLA normalises its latents under this flag too
        args.append(["--qk-layernorm"])
    if m.sliding_window:
        args.append(["--window-size", f"{m.sliding_window},0"])
        if m.full_attention_period:
            args.append(["--window-attn-skip-freq", str(m.full_attention_period)])
    if m.attention_sinks:
        args.append(["--softmax-type", "learnable"])
    if m.glu_clamp_limit:  # GPT-OSS's clamped GLU (TransformerConfig.activation_func_clamp_value)
        args.append(["--activation-func-clamp-value", f"{m.glu_clamp_limit:g}"])
    if m.mtp_num_layers:
        args.append(["--mtp-num-layers", str(m.mtp_num_layers)])
    if m.is_hybrid:
        args += [["--hybrid-override-pattern", m.hybrid_pattern],
                 ["--mamba-num-heads", str(m.mamba_num_heads)], ["--mamba-head-dim", str(m.mamba_head_dim)],
                 ["--mamba-state-dim", str(m.mamba_state_size)], ["--mamba-num-groups", str(m.mamba_groups)]]
        warnings.append("hybrid Mamba model: these arguments are for pretrain_mamba.py, not pretrain_gpt.py")
    return args


VPP_FLAG = "--num-layers-per-virtual-pipeline-stage"
EMBEDDING_LOSS_FLAGS = [["--account-for-embedding-in-pipeline-split"], ["--account-for-loss-in-pipeline-split"]]
"""The embedding and the loss count as one layer each in the pipeline split: Megatron-Core's
``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py) adds one layer per
flag, splits the ``num_layers + 2`` slots evenly over pp x vpp and gives the first and the last
virtual stage one transformer layer fewer (none with one slot per stage: the Llama 3.1 405B
Megatron-Bridge recipe, pp16 x vpp8 for 126 layers, llama31_workload_base_configs.py@0013c9a).
The virtual stage size counts the slots: ``(num_layers + 2) / (pp * vpp)``."""


def _embedding_loss(layers: tuple[int, ...], num_layers: int) -> bool:
    """Whether ``layers`` is the embedding / loss split (``plan.embedding_loss_split``) and not
    also the even one (which needs no flag)."""
    stages = len(layers)
    if stages < 2 or (num_layers + 2) % stages or (stages <= num_layers and layers == even_split(num_layers, stages)):
        return False
    return tuple(layers) == embedding_loss_split(num_layers, stages)


def _stage_split_args(job: Job, warnings: list[str]) -> list[list[str]]:
    """Even split; first/last-stage counts with even middle stages (vpp = 1); else the layout
    (``meshplan.plan.layout``), which also places MTP modules on a stage other than the last."""
    plan = job.full_plan
    layers, pp, vpp = plan.stage_layers, plan.dims.pp, plan.vpp
    if pp == 1:
        return []
    if plan.mtp_stage is None:
        if vpp > 1 and not job.model.mtp_num_layers and _embedding_loss(layers, job.model.num_layers):
            return EMBEDDING_LOSS_FLAGS + [[VPP_FLAG, str((job.model.num_layers + 2) // (pp * vpp))]]
        if len(set(layers)) == 1:
            return [[VPP_FLAG, str(layers[0])]] if vpp > 1 else []
        if vpp == 1 and len(set(layers[1:-1])) <= 1:  # middle stages even (or none, pp == 2)
            return [["--decoder-first-pipeline-num-layers", str(layers[0])],
                    ["--decoder-last-pipeline-num-layers", str(layers[-1])]]
    warnings.append(f"layer split {list(layers)} written as --pipeline-model-parallel-layout, which "
                    "Megatron-Core marks experimental (recent versions only)")
    text = format_layout(layers, mtp_layers=job.model.mtp_num_layers, mtp_stage=plan.mtp_stage)
    return [["--pipeline-model-parallel-layout", text]]


def _recompute_args(job: Job) -> list[list[str]]:
    plan = job.full_plan
    if plan.recompute == Recompute.NONE:
        return []
    every, _ = uniform_recompute(plan)
    if plan.recompute == Recompute.SELECTIVE:
        if not every:
            raise MeshplanError(
                "Megatron-LM's selective recompute covers every layer; the plan recomputes "
                f"{list(plan.recompute_layers)} of {list(plan.stage_layers)} layers per stage"
            )
        if plan.recompute_modules:  # Megatron-Core's default is core_attn alone, the plan's empty set
            # moe_act needs --moe-grouped-gemm (TransformerConfig: "moe_act in recompute_modules is
            # only supported with moe_grouped_gemm"), which _moe_args writes for every MoE model
            return [["--recompute-granularity", "selective"],
                    ["--recompute-modules", *(m.value for m in plan.recompute_modules)]]
        return [["--recompute-granularity", "selective"]]
    if every:
        # uniform with 1 layer per group: every layer's input kept, every layer recomputed
        return [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                ["--recompute-num-layers", "1"]]
    # block: the first k layers of each (virtual) stage are recomputed (all of a shorter stage)
    count = max(plan.recompute_layers)
    if any(min(count, n) != r for r, n in zip(plan.recompute_layers, plan.stage_layers)):
        raise MeshplanError(
            "Megatron-LM recomputes the first k layers of every (virtual) stage; the plan recomputes "
            f"{list(plan.recompute_layers)} of {list(plan.stage_layers)} layers per stage"
        )
    return [["--recompute-granularity", "full"], ["--recompute-method", "block"],
            ["--recompute-num-layers", str(count)]]


def megatron_args(job: Job) -> tuple[list[list[str]], list[str]]:
    """The argument groups (each a flag and its values) and the warnings."""
    plan, d, t = job.plan, job.plan.dims, job.training
    warnings: list[str] = []
    args: list[list[str]] = [
        ["--tensor-model-parallel-size", str(d.tp)],
        ["--pipeline-model-parallel-size", str(d.pp)],
        ["--context-parallel-size", str(d.cp)],
    ]
    if d.cp > 1 and plan.cp_method == CPMethod.ALL_TO_ALL:
        args.append(["--cp-comm-type", "a2a"])
    if d.ep > 1:
        args.append(["--expert-model-parallel-size", str(d.ep)])
    if d.etp and d.etp != d.tp:  # MoE parallel folding; Megatron's default is etp = tp
        args.append(["--expert-tensor-parallel-size", str(d.etp)])
    if plan.sp:
        args.append(["--sequence-parallel"])
    if d.pp > 1 and plan.schedule == Schedule.ZERO_BUBBLE:
        raise MeshplanError("Megatron-LM has no zero-bubble schedule; use 1f1b or interleaved-1f1b")
    if d.pp > 1 and plan.schedule == Schedule.GPIPE:
        warnings.append("Megatron-LM has no GPipe schedule: 1F1B runs instead (same bubble, "
                        "fewer micro-batches in flight, so less activation memory)")
    args += _stage_split_args(job, warnings)
    args += [["--micro-batch-size", str(plan.micro_batch)], ["--global-batch-size", str(t.global_batch)],
             ["--seq-length", str(t.seq_len)]]
    args += _recompute_args(job)
    # Megatron-LM shards the distributed optimizer and FSDP2 over the data-parallel x context-
    # parallel group, as meshplan's ZeRO shards over dp_shard x cp (cost/plan_terms.py): so a plan
    # with dp_shard 1 and cp > 1 still shards (get_megatron_optimizer passes intra_dp_cp_group as
    # the optimizer's data_parallel_group, megatron/core/optimizer/__init__.py@0044db1;
    # TorchFullyShardedDataParallel meshes get_data_parallel_group(with_context_parallel=True),
    # megatron/core/distributed/torch_fully_sharded_data_parallel.py@00caa53). ZeRO over one rank
    # (dp_shard * cp = 1) is the same flags, not plain DDP: the distributed optimizer over
    # instances of one rank (--num-distributed-optimizer-instances = dp * cp, an intra-instance
    # group of size 1: megatron/core/parallel_state.py@00caa53), which export/import_megatron.py
    # reads back as zero 1, so that the round trip is exact (the cost model prices it as zero 0:
    # nothing is sharded)
    if plan.zero >= 1:
        if plan.zero == 3:
            if d.pp > 1 or d.dp_replicate > 1:
                raise MeshplanError(
                    "Megatron-LM's FSDP (--use-torch-fsdp2) works without pipeline parallel and "
                    "without replication; the plan has pp={d.pp}, dp_replicate={d.dp_replicate}"
                    .format(d=d)
                )
            args.append(["--use-torch-fsdp2"])
        else:
            args.append(["--use-distributed-optimizer"])
            if d.dp_replicate > 1:
                args.append(["--num-distributed-optimizer-instances", str(d.dp_replicate)])
            if t.overlap_grad_reduce:  # the parameter all-gather needs both (validate_args)
                args += [["--overlap-grad-reduce"], ["--overlap-param-gather"]]
            if plan.zero == 2:
                warnings.append("zero=2 mapped to Megatron's distributed optimizer: it shards "
                                "optimizer states and reduce-scatters gradients but keeps a full "
                                "gradient buffer (ZeRO-1 memory for gradients)")
    elif d.dp_replicate * d.cp > 1 and t.overlap_grad_reduce:
        # Megatron-LM's --overlap-grad-reduce is off by default (store_true,
        # megatron/training/arguments.py _add_distributed_args): the plan's costs assume it on; its
        # DDP reduces the gradients over data-parallel x context-parallel ranks (cp ranks hold the
        # same weights), so cp > 1 alone has a reduction to overlap
        args.append(["--overlap-grad-reduce"])
    refuse_expert_placement(plan, "Megatron-LM")
    refuse_data_schedule(job, "Megatron-LM")
    if plan.vocab_parallel:
        raise MeshplanError("Megatron-LM has no vocabulary parallelism over pipeline ranks (Yeung et al. "
                            "2024 is a fork of it); plan without --vocab-parallel")
    if uses_osdp(plan):
        raise MeshplanError("Megatron-LM shards every parameter alike (distributed optimizer or FSDP); "
                            f"per operator-group keeps and operator splits ({osdp_notation(plan)}) are not "
                            "expressible: plan without them")
    args += _offload_args(job)
    args += _moe_args(job.model, t)
    args += _model_args(job.model, t.seq_len, warnings)
    prec = _precision_args(t)
    if prec:
        args.append(prec)
    return args, warnings


def _offload_args(job: Job) -> list[list[str]]:
    """Megatron-LM offloads the distributed optimizer's states and step to the host
    (``--optimizer-cpu-offload``, HybridDeviceOptimizer; fraction 1: all of it) and the
    activations of the first N layers (``--cpu-offloading --cpu-offloading-num-layers N``,
    TransformerConfig.cpu_offloading*, megatron/core/transformer/transformer_config.py: N below
    the layer count, no pipeline parallel, no recompute); not the parameters."""
    plan = job.plan
    if not plan.offload:
        return []
    if Offload.PARAMS in plan.offload:
        raise MeshplanError("Megatron-LM offloads the optimizer (--optimizer-cpu-offload) and activations "
                            "(--cpu-offloading), not the parameters; plan without offload 'params'")
    out: list[list[str]] = []
    if Offload.OPTIMIZER in plan.offload:
        if plan.zero not in (1, 2):
            raise MeshplanError("Megatron-LM's --optimizer-cpu-offload needs the distributed optimizer "
                                f"(zero 1 or 2); the plan has zero {plan.zero}")
        out += [["--optimizer-cpu-offload"], ["--optimizer-offload-fraction", "1.0"]]
    if Offload.ACTIVATIONS in plan.offload:
        layers = job.model.num_layers
        if plan.dims.pp > 1:
            raise MeshplanError(f"Megatron-Core's activation offload (--cpu-offloading) runs without pipeline "
                                f"parallel; the plan has pp={plan.dims.pp}")
        if plan.recompute != Recompute.NONE:
            raise MeshplanError("Megatron-Core's activation offload (--cpu-offloading) does not work with "
                                f"activation recompute; the plan recomputes ({plan.recompute.value})")
        # offload_layers 0 means every layer but the ones in flight: Megatron's most, num_layers - 1
        count = plan.offload_layers or layers - 1
        if not 0 < count < layers:
            raise MeshplanError(f"Megatron-Core offloads the activations of fewer layers than the model's "
                                f"{layers}; the plan offloads {plan.offload_layers}")
        out += [["--cpu-offloading"], ["--cpu-offloading-num-layers", str(count)]]
    return out


def export_megatron(job: Job) -> Export:
    args, warnings = megatron_args(job)
    lines = [f"# meshplan plan: {job.plan.notation()} on {job.cluster.num_gpus} GPUs "
             f"({job.cluster.num_nodes} nodes x {job.cluster.gpus_per_node})",
             f"# launch: {env_assignments()} torchrun --nnodes {job.cluster.num_nodes} --nproc-per-node "
             f"{job.cluster.gpus_per_node} pretrain_gpt.py <these arguments> <data, tokenizer, lr...>"]
    lines += [" ".join(a) + " \\" for a in args]
    lines[-1] = lines[-1].removesuffix(" \\")
    return Export(ExportTarget.MEGATRON, "\n".join(lines) + "\n", tuple(warnings))
