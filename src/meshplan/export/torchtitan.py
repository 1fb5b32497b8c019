"""Job -> torchtitan job config TOML ([training], [parallelism], [activation_checkpoint]).

Field names checked against torchtitan/config/job_config.py and the schedule names against
torch.distributed.pipelining.schedules.get_schedule_class (see docs/interop.md).
FSDP2 is ZeRO-3 when parameters are resharded after forward and ZeRO-2 when they are not
(``fsdp_reshard_after_forward = "never"``). The layer split is written as explicit split points
(``layers.<i>`` starts a stage), which expresses any per-stage split exactly.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.export.base import (Export, ExportTarget, refuse_data_schedule, refuse_expert_placement,
                                  refuse_moe_routing, refuse_recompute_modules, uniform_recompute)
from meshplan.export.osdp import osdp_notation, uses_osdp
from meshplan.plan import CPMethod, Job, Offload, Recompute, Schedule
from meshplan.spec.training import Precision, Recipe

SCHEDULE_NAMES = {
    Schedule.GPIPE: "GPipe",
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED_1F1B: "Interleaved1F1B",
    Schedule.ZERO_BUBBLE: "InterleavedZeroBubble",
}


def split_points(stage_layers: tuple[int, ...]) -> list[str]:
    """``layers.<i>`` at the first layer of every stage but the first."""
    points, start = [], 0
    for n in stage_layers[:-1]:
        start += n
        points.append(f"layers.{start}")
    return points


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def torchtitan_sections(job: Job) -> tuple[dict[str, dict[str, object]], list[str]]:
    """Section name -> {field: value} for the TOML, and the warnings."""
    plan = job.full_plan
    d, t = plan.dims, job.training
    warnings: list[str] = []
    if t.precision == Precision.FP16:
        warnings.append("torchtitan has no fp16 mixed precision (no loss scaling): exported as "
                        "bfloat16, which has the same matmul peak on A100/H100")
    training: dict[str, object] = {"seq_len": t.seq_len, "global_batch_size": t.global_batch}
    if d.pp > 1:
        # local batch = this DP rank's share of the step, split into pipeline micro-batches
        training["local_batch_size"] = t.global_batch // d.dp
    else:
        # no pipeline: one micro-batch per forward, gradient accumulation over the rest
        training["local_batch_size"] = plan.micro_batch
    training["mixed_precision_param"] = "float32" if t.precision == Precision.FP32 else "bfloat16"
    refuse_expert_placement(plan, "torchtitan")
    if plan.mtp_stage is not None:
        raise MeshplanError(f"torchtitan's split points place transformer layers only, not multi-token-prediction "
                            f"modules: mtp_stage={plan.mtp_stage} is not expressible; plan with them on the last stage")
    if plan.vocab_parallel:
        raise MeshplanError("torchtitan has no vocabulary parallelism over pipeline ranks; plan without --vocab-parallel")
    if uses_osdp(plan):
        raise MeshplanError("torchtitan's parallelism.fsdp_reshard_after_forward is one policy for every "
                            f"layer and it has no operator splitting: {osdp_notation(plan)} is not expressible; "
                            "plan without them (or run it with meshplan train)")
    # torchtitan applies FSDP2 exactly when dp_shard > 1 or cp > 1, over the dp_shard x cp ranks
    # (ParallelDims.fsdp_enabled, torchtitan/distributed/parallel_dims.py; DDP over the replicas
    # otherwise), as meshplan's ZeRO shards over dp_shard x cp: no sharding over cp, and no ZeRO
    # over a single rank, is not expressible
    fsdp = d.dp_shard * d.cp > 1
    if fsdp and plan.zero == 0:
        raise MeshplanError(f"torchtitan shards the model with FSDP over the context-parallel ranks whenever "
                            f"cp > 1: zero 0 with cp {d.cp} is not expressible; plan zero 2 or 3")
    if not fsdp and plan.zero:
        raise MeshplanError(f"torchtitan applies FSDP only over dp_shard x cp > 1 ranks: zero {plan.zero} over "
                            f"dp_shard {d.dp_shard} x cp {d.cp} = 1 rank is not expressible; plan zero 0")
    if plan.offload:
        # FSDP2's CPUOffloadPolicy: parameters, gradients and the optimizer step on the host
        if set(plan.offload) != {Offload.OPTIMIZER, Offload.PARAMS} or not fsdp:
            raise MeshplanError("torchtitan offloads parameters, gradients and optimizer states together "
                                "(training.enable_cpu_offload, FSDP over dp_shard x cp > 1): offload "
                                f"optimizer+params only, the plan has {'+'.join(o.value for o in plan.offload)} "
                                f"with dp_shard {d.dp_shard}, cp {d.cp}")
        training["enable_cpu_offload"] = True

    par: dict[str, object] = {
        "data_parallel_replicate_degree": d.dp_replicate,
        "data_parallel_shard_degree": d.dp_shard,
    }
    if fsdp:
        if plan.zero == 1:
            warnings.append("zero=1 mapped to FSDP2 without resharding after forward (ZeRO-2): "
                            "torchtitan has no optimizer-only sharding")
        par["fsdp_reshard_after_forward"] = "always" if plan.zero == 3 else "never"
    par["tensor_parallel_degree"] = d.tp
    if d.tp > 1 and not plan.sp:
        warnings.append("torchtitan's tensor-parallel plan always shards norms and dropout over "
                        "the sequence (sequence parallel): exported with sp on")
    par["pipeline_parallel_degree"] = d.pp
    if d.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULE_NAMES[plan.schedule]
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        par["pipeline_parallel_split_points"] = split_points(plan.stage_layers)
    par["context_parallel_degree"] = d.cp
    if d.cp > 1:
        par["context_parallel_rotate_method"] = "alltoall" if plan.cp_method == CPMethod.ALL_TO_ALL else "allgather"
        if plan.cp_method == CPMethod.ALL_TO_ALL:
            warnings.append("torchtitan's context parallel is ring attention; 'alltoall' only "
                            "changes how K/V shards rotate (not Ulysses head/sequence all-to-all)")
    par["expert_parallel_degree"] = d.ep
    # torchtitan/models/moe/moe.py@08dc75a: token-choice MoEArgs with no capacity (dropless grouped
    # GEMMs); tokens move by all-to-all (DeepEP is a model-args switch, which no override reaches)
    refuse_moe_routing(job, "torchtitan", dispatchers=("alltoall",), drops_tokens=False)
    refuse_data_schedule(job, "torchtitan")
    if d.etp and d.etp != d.tp:  # torchtitan's ETP is 1 or the dense tp
        if d.etp != 1:
            raise MeshplanError(f"torchtitan's expert tensor parallel degree is 1 or tp={d.tp}, not {d.etp}")
        par["expert_tensor_parallel_degree"] = 1

    ac: dict[str, object] = {}
    if plan.recompute == Recompute.NONE:
        ac["mode"] = "none"
    elif plan.recompute == Recompute.SELECTIVE:
        refuse_recompute_modules(plan, "torchtitan")
        every, _ = uniform_recompute(plan)
        if not every:
            raise MeshplanError("torchtitan's per-op selective checkpointing covers every layer; "
                                f"the plan recomputes {list(plan.recompute_layers)} layers per stage")
        ac["mode"] = "selective"
        ac["selective_ac_option"] = "op"
        warnings.append("selective recompute mapped to torchtitan's per-op policy, which saves "
                        "every other matmul output and the attention kernel's, and recomputes the "
                        "rest (less memory and more recompute than Korthikanti's attention-core "
                        "recompute; `--target torchtitan` estimates it so)")
    else:
        every, _ = uniform_recompute(plan)
        if every:
            ac["mode"] = "full"
        else:
            ac["mode"] = "selective"
            ac["selective_ac_option"] = str(_every_nth(plan.stage_layers, plan.recompute_layers))
    sections: dict[str, dict[str, object]] = {}
    sections.update(_low_precision_sections(t, warnings))
    sections["training"] = training
    sections["parallelism"] = par
    sections["activation_checkpoint"] = ac
    return sections, warnings


def _low_precision_sections(t, warnings: list[str]) -> dict[str, dict[str, object]]:
    """torchtitan's torchao converters: ``float8`` with a tensorwise or rowwise recipe, ``mx``
    with mxfp8. No delayed or blockwise fp8, no fp4 training: refused in one line."""
    if t.precision == Precision.FP4:
        raise MeshplanError(f"torchtitan has no fp4 ({t.recipe.value}) training converter; "
                            "export fp4 plans to megatron")
    if t.precision != Precision.FP8:
        return {}
    if t.recipe in (Recipe.TENSORWISE, Recipe.ROWWISE):
        warnings.append(f"fp8 {t.recipe.value} mapped to torchtitan's float8 converter (needs torchao)")
        return {"model": {"converters": ["float8"]}, "float8": {"recipe_name": t.recipe.value}}
    if t.recipe == Recipe.MXFP8:
        warnings.append("mxfp8 mapped to torchtitan's mx converter (needs torchao and a Blackwell GPU)")
        return {"model": {"converters": ["mx"]}, "mx": {"recipe_name": "mxfp8"}}
    raise MeshplanError(f"torchtitan has no {t.recipe.value} fp8 recipe (it runs tensorwise, rowwise "
                        "and mxfp8); choose one with --recipe")


def _every_nth(layers: tuple[int, ...], rec: tuple[int, ...]) -> int:
    """torchtitan's layer-level option k checkpoints every k-th block: n // k of n per stage."""
    for k in range(2, max(layers) + 1):
        if all(n // k == r for n, r in zip(layers, rec)):
            return k
    raise MeshplanError(
        "torchtitan recomputes whole layers only as every k-th block; the plan's "
        f"{list(rec)} of {list(layers)} layers per stage is not of that form"
    )


def export_torchtitan(job: Job) -> Export:
    sections, warnings = torchtitan_sections(job)
    lines = [f"# meshplan plan: {job.plan.notation()} on {job.cluster.num_gpus} GPUs "
             f"(NGPU={job.cluster.gpus_per_node} per node, {job.cluster.num_nodes} nodes)",
             f"# model: {job.model.name}; set [model] name/flavor to the matching torchtitan model"]
    for name, fields in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    return Export(ExportTarget.TORCHTITAN, "\n".join(lines) + "\n", tuple(warnings))
