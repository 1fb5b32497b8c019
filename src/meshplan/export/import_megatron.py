"""Megatron-LM command line -> Plan, TrainingSpec and (when shape arguments are given) ModelSpec.

Reads the arguments that set parallelism, batch, recompute, precision and model shape; every
other argument (data, tokenizer, learning rate...) is ignored. A ``torchrun``/launcher prefix
with ``--nnodes`` and ``--nproc-per-node`` gives the GPU count when present.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.export.import_megatron_model import _check_same_shape, _model_from_args
from meshplan.export.import_megatron_parser import _parser, launcher_size, legacy_flags, split_command
from meshplan.plan import (CPMethod, Offload, ParallelDims, Plan, Recompute, RecomputeModule, Schedule,
                           data_parallel_degree, embedding_loss_split, parse_layout)
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import MoeDispatcher, Precision, TrainingSpec

__all__ = ["MEGATRON_DEFAULT_DISPATCHER", "MegatronImport", "import_megatron", "launcher_size", "split_command"]


@dataclass(frozen=True)
class MegatronImport:
    """What a Megatron command line says. ``model`` is None when it gives no shape arguments."""

    plan: Plan
    training: TrainingSpec
    model: ModelSpec | None
    num_gpus: int | None
    """From the launcher's --nnodes x --nproc-per-node, when present."""
    gpus_per_node: int | None
    ignored: tuple[str, ...]
    """Flags that were not read (learning rate, data paths...)."""
    legacy_flags: tuple[str, ...] = ()
    """Flags only Megatron-LM of 2020-22 spells so (import_megatron_parser.LEGACY_FLAGS): the text
    describes a run of that era."""


MEGATRON_DEFAULT_DISPATCHER = MoeDispatcher.ALLGATHER
"""Megatron-LM's --moe-token-dispatcher-type when none is given (arguments.py@000c4ac, _add_moe_args)."""


def _positive(name: str, v: int | None, default: int) -> int:
    v = default if v is None else v
    if v < 1:
        raise MeshplanError(f"Megatron argument {name} must be positive, got {v}")
    return v


def _accounts_embedding_loss(a: argparse.Namespace) -> bool:
    """Both ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
    (export/megatron.py writes them together); one alone is refused (meshplan's split keeps the
    embedding and the loss on the first and last stage, both or neither counted as a layer)."""
    embedding, loss = a.account_for_embedding_in_pipeline_split, a.account_for_loss_in_pipeline_split
    if embedding != loss:
        given = "embedding" if embedding else "loss"
        raise MeshplanError(f"--account-for-{given}-in-pipeline-split without the other is not imported: "
                            "give both --account-for-embedding-in-pipeline-split and "
                            "--account-for-loss-in-pipeline-split, or a --pipeline-model-parallel-layout")
    return embedding


def _stage_layers(a: argparse.Namespace, num_layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    if _accounts_embedding_loss(a):
        if a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None:
            raise MeshplanError("--account-for-embedding/loss-in-pipeline-split with "
                                "--decoder-first/last-pipeline-num-layers: give one or the other")
        return embedding_loss_split(num_layers, pp * vpp) if pp > 1 else ()
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if first is None and last is None:
        if num_layers % (pp * vpp):
            raise MeshplanError(f"Megatron needs num_layers={num_layers} divisible by pp*vpp={pp * vpp}")
        return ()
    if vpp > 1:
        raise MeshplanError("--decoder-first/last-pipeline-num-layers with virtual stages is not "
                            "imported (meshplan keeps per-virtual-stage counts)")
    inner = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if inner < 0 or rest < 0 or (inner and rest % inner) or (inner == 0 and rest):
        raise MeshplanError(f"--decoder-first/last-pipeline-num-layers leave {rest} layers that do not "
                            f"split evenly over the {max(inner, 0)} middle stages")
    mid = rest // inner if inner else 0
    layers = [mid] * pp
    if first is not None:
        layers[0] = first
    if last is not None:
        layers[-1] = last
    return tuple(layers)


def import_megatron(text: str, *, num_gpus: int | None = None, vocab_default: int | None = None,
                    model: ModelSpec | None = None, name: str = "megatron-model",
                    default_dispatcher: MoeDispatcher | None = MEGATRON_DEFAULT_DISPATCHER) -> MegatronImport:
    """Parse a Megatron-LM command line. ``num_gpus`` (else the launcher's) sets the DP size.
    ``default_dispatcher``: the MoE dispatcher when the text names none (Megatron-LM's allgather;
    None keeps meshplan's own, for texts whose defaults come from elsewhere, e.g. a Bridge recipe)."""
    words = split_command(text)
    a, rest = _parser().parse_known_args(words)
    ignored = tuple(w for w in rest if w.startswith("--"))
    launcher_gpus = a.nnodes * a.nproc_per_node if a.nnodes and a.nproc_per_node else None
    gpus = num_gpus or launcher_gpus
    if gpus is None:
        raise MeshplanError("the GPU count is unknown: give --gpus (or --nodes) or include the "
                            "launcher's --nnodes and --nproc-per-node")
    parsed_model = _model_from_args(a, vocab_default if model is None else model.vocab_size, name)
    if parsed_model is not None and model is not None:
        _check_same_shape(a, model)
    spec = parsed_model or model
    tp = _positive("--tensor-model-parallel-size", a.tensor_model_parallel_size or a.model_parallel_size, 1)
    pp = _positive("--pipeline-model-parallel-size", a.pipeline_model_parallel_size, 1)
    cp = _positive("--context-parallel-size", a.context_parallel_size, 1)
    ep = _positive("--expert-model-parallel-size", a.expert_model_parallel_size, 1)
    etp = _positive("--expert-tensor-parallel-size", a.expert_tensor_parallel_size, tp)
    dp = data_parallel_degree(gpus, tp=tp, pp=pp, cp=cp)

    vpp = 1
    # --pipeline-model-parallel-layout: layers per virtual stage and the MTP modules' stage
    parsed = parse_layout(a.pipeline_model_parallel_layout) if a.pipeline_model_parallel_layout else None
    layout = parsed.stage_layers if parsed is not None else ()
    if layout:
        if len(layout) % pp:
            raise MeshplanError(f"the pipeline layout has {len(layout)} chunks, not a multiple of pp={pp}")
        vpp = len(layout) // pp
        mtp_modules = spec.mtp_num_layers if spec is not None else None
        if mtp_modules is not None and parsed.mtp_layers not in (0, mtp_modules):
            raise MeshplanError(f"the pipeline layout holds {parsed.mtp_layers} MTP module(s) (m), the model "
                                f"{mtp_modules}")
    elif a.num_virtual_stages_per_pipeline_rank:
        vpp = a.num_virtual_stages_per_pipeline_rank
    elif a.num_layers_per_virtual_pipeline_stage:
        if spec is None:
            raise MeshplanError("--num-layers-per-virtual-pipeline-stage needs the model's layer count "
                                "(--num-layers in the arguments, or --model)")
        slots = spec.num_layers + 2 * _accounts_embedding_loss(a)  # the embedding and the loss as layers
        per_rank, r = divmod(slots, pp)
        if r or per_rank % a.num_layers_per_virtual_pipeline_stage:
            raise MeshplanError(f"{slots} layers over pp={pp} do not split into virtual stages "
                                f"of {a.num_layers_per_virtual_pipeline_stage} layers")
        vpp = per_rank // a.num_layers_per_virtual_pipeline_stage
    if layout and _accounts_embedding_loss(a):
        raise MeshplanError("--account-for-embedding/loss-in-pipeline-split with --pipeline-model-parallel-layout: "
                            "the layout places the embedding and the loss itself; give one or the other")
    if layout:
        if spec is not None and sum(layout) != spec.num_layers:
            raise MeshplanError(f"the pipeline layout holds {sum(layout)} layers, the model {spec.num_layers}")
        stage_layers = layout
    else:
        stage_layers = _stage_layers(a, spec.num_layers, pp, vpp) if spec is not None else ()

    if a.use_torch_fsdp2:
        zero, dims = 3, dict(dp_shard=dp)
    elif a.use_distributed_optimizer:
        inst = _positive("--num-distributed-optimizer-instances", a.num_distributed_optimizer_instances, 1)
        # Megatron splits the data-parallel x context-parallel ranks into inst instances of
        # consecutive ranks, context-parallel innermost (initialize_model_parallel,
        # megatron/core/parallel_state.py@00caa53: (dp * cp) % inst == 0); meshplan's replicas are
        # whole data-parallel ranks (dp_replicate, each sharding over dp_shard x cp), so inst
        # must also divide dp. dp * cp // inst = 1 is the distributed optimizer over one rank
        # (zero 1, dp_shard 1), not plain DDP: export/megatron.py writes it back the same way
        if (dp * cp) % inst:
            raise MeshplanError(f"--num-distributed-optimizer-instances {inst} does not divide dp*cp={dp * cp} "
                                "(Megatron-LM's own rule)")
        if dp % inst:
            raise MeshplanError(f"--num-distributed-optimizer-instances {inst} splits the context-parallel "
                                f"ranks of a data-parallel rank (dp={dp}, cp={cp}): meshplan's optimizer "
                                "replicas are whole data-parallel ranks, so the instances must divide dp")
        zero, dims = 1, dict(dp_shard=dp // inst, dp_replicate=inst)
    else:
        zero, dims = 0, dict(dp_replicate=dp)

    granularity = a.recompute_granularity
    if granularity is None and a.recompute_activations:
        granularity = "selective"  # --recompute-activations is the old spelling of selective
    if granularity is None and a.checkpoint_activations:
        granularity = "full"  # --checkpoint-activations is the oldest spelling of full/uniform
    recompute, rec_layers = Recompute.NONE, ()
    if granularity == "selective":
        recompute = Recompute.SELECTIVE
    elif granularity == "full":
        recompute = Recompute.FULL
        if a.recompute_method == "block":
            if spec is None:
                raise MeshplanError("--recompute-method block needs the model's layer count")
            from meshplan.plan import even_split

            per_stage = stage_layers or even_split(spec.num_layers, pp * vpp)
            n = _positive("--recompute-num-layers", a.recompute_num_layers, 1)
            rec_layers = tuple(min(n, k) for k in per_stage)

    if a.bf16 and a.fp16:  # Megatron-LM's own arguments.py asserts the same
        raise MeshplanError("the Megatron arguments give both --fp16 and --bf16: keep one")
    recipe = None
    if a.fp4_format:
        precision, recipe = Precision.FP4, a.fp4_recipe or "nvfp4"  # Megatron's default fp4 recipe
    elif a.fp8_format:
        precision, recipe = Precision.FP8, a.fp8_recipe or "delayed"  # Megatron's default fp8 recipe
    elif a.bf16:
        precision = Precision.BF16
    elif a.fp16:
        precision = Precision.FP16
    else:
        precision = Precision.FP32
    if a.global_batch_size is None:
        raise MeshplanError("the Megatron arguments give no --global-batch-size")
    if a.seq_length is None:
        raise MeshplanError("the Megatron arguments give no --seq-length")
    if a.overlap_param_gather and not (a.overlap_grad_reduce and a.use_distributed_optimizer):
        raise MeshplanError("--overlap-param-gather needs --overlap-grad-reduce and --use-distributed-optimizer "
                            "(Megatron-LM's validate_args refuses it otherwise)")
    # Megatron-LM reduces the gradients after the backward unless told (--overlap-grad-reduce is
    # off by default); with no data or context parallelism (its DDP reduces over both), or under
    # FSDP2, the flag has nothing to say
    overlap_grad_reduce = bool(a.overlap_grad_reduce) or dp * cp == 1 or zero == 3
    training = TrainingSpec(seq_len=a.seq_length, global_batch=a.global_batch_size, precision=precision,
                            recipe=recipe, overlap_grad_reduce=overlap_grad_reduce,
                            **_moe_fields(a, default_dispatcher if _is_moe(a, spec) else None))
    cp_method = CPMethod.ALL_TO_ALL if a.cp_comm_type and a.cp_comm_type[0] == "a2a" else CPMethod.RING
    plan = Plan(
        dims=ParallelDims(tp=tp, pp=pp, cp=cp, ep=ep, etp=0 if etp == tp else etp, **dims),
        zero=zero,
        sp=a.sequence_parallel,
        schedule=Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B,
        vpp=vpp,
        stage_layers=stage_layers,
        mtp_stage=parsed.mtp_stage if parsed is not None and spec is not None and spec.mtp_num_layers else None,
        cp_method=cp_method,
        micro_batch=_positive("--micro-batch-size", a.micro_batch_size, 1),
        recompute=recompute,
        recompute_layers=rec_layers,
        recompute_modules=_modules(a) if recompute == Recompute.SELECTIVE else (),
        offload=_offload(a) + _activation_offload(a)[0],
        offload_layers=_activation_offload(a, spec)[1],
    )
    nproc = a.nproc_per_node
    return MegatronImport(plan=plan, training=training, model=parsed_model, num_gpus=launcher_gpus,
                          gpus_per_node=nproc if launcher_gpus else None, ignored=ignored,
                          legacy_flags=legacy_flags(words))


def _is_moe(a, spec: ModelSpec | None) -> bool:
    """Whether the run routes tokens to experts: a dense run has no dispatcher, so Megatron-LM's
    default one is not read into its training (a dense plan exported and read back is the same)."""
    return bool(a.num_experts) or (spec is not None and spec.is_moe)


def _moe_fields(a, default_dispatcher: MoeDispatcher | None) -> dict[str, object]:
    """The dispatcher and capacity factor. Without --moe-token-dispatcher-type Megatron-LM runs
    allgather (megatron/training/arguments.py@000c4ac, _add_moe_args: ``default='allgather'``), not
    meshplan's default; a capacity without padding to it is not what the cost model prices
    (cost/layer.py)."""
    out: dict[str, object] = {}
    given = a.moe_token_dispatcher_type
    if given is not None or default_dispatcher is not None:
        out["moe_dispatcher"] = MoeDispatcher(given) if given is not None else default_dispatcher
    if a.moe_expert_capacity_factor is not None:
        if not a.moe_pad_expert_input_to_capacity:
            raise MeshplanError("--moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: "
                                "meshplan prices token-drop MoE padded to capacity; add it")
        out["moe_capacity_factor"] = a.moe_expert_capacity_factor
    return out


def _modules(a) -> tuple[RecomputeModule, ...]:
    """``--recompute-modules``: Megatron-Core's names (export/megatron.py writes them)."""
    names = a.recompute_modules or ()
    known = {m.value for m in RecomputeModule}
    bad = [n for n in names if n not in known]
    if bad:
        raise MeshplanError(f"--recompute-modules {bad[0]!r} is not one of {', '.join(sorted(known))}")
    return tuple(RecomputeModule(n) for n in names)


def _activation_offload(a, spec=None) -> tuple[tuple[Offload, ...], int]:
    """``--cpu-offloading --cpu-offloading-num-layers N``: activations of N layers on the host; N =
    num_layers - 1 (Megatron-Core's most, what the export writes for every layer) reads as 0, all."""
    if not a.cpu_offloading:
        return (), 0
    n = a.cpu_offloading_num_layers
    if n is None or n < 1:
        raise MeshplanError(f"--cpu-offloading with --cpu-offloading-num-layers {n}: meshplan reads the layers "
                            "whose activations are offloaded from it (>= 1)")
    every = spec is not None and n == spec.num_layers - 1
    return (Offload.ACTIVATIONS,), 0 if every else n


def _offload(a) -> tuple[Offload, ...]:
    """``--optimizer-cpu-offload`` (HybridDeviceOptimizer): the whole optimizer on the host; a
    fraction below 1 keeps part of it on the GPU, which meshplan does not model."""
    fraction = a.optimizer_offload_fraction
    if not a.optimizer_cpu_offload:
        return ()
    if fraction is not None and fraction != 1.0:
        raise MeshplanError(f"--optimizer-offload-fraction {fraction}: meshplan models the whole optimizer "
                            "on the host (fraction 1.0) only")
    return (Offload.OPTIMIZER,)
