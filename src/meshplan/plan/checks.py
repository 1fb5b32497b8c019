"""Whether a ``Plan`` fits what is trained: the model's layers, heads and experts, the batch and
sequence length, the GPU count. Raised as MeshplanError naming the first value that does not fit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.plan.choices import CPMethod, RecomputeModule, Schedule

if TYPE_CHECKING:
    from meshplan.plan.core import Plan
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec


def check_model_takes(model: "ModelSpec", training: "TrainingSpec") -> None:
    """Raise MeshplanError when the model cannot take the training's sequences at all, whatever
    the plan: a learned position table has ``max_position`` rows (GPT-2: 1024)."""
    if model.position.value == "learned" and training.seq_len > model.max_position:
        raise MeshplanError(f"seq_len={training.seq_len} exceeds {model.name}'s max_position="
                            f"{model.max_position} (learned position embeddings)")
    if training.expert_load is not None and not model.is_moe:
        raise MeshplanError(f"an expert load (--expert-skew / --expert-load) describes MoE routing; "
                            f"{model.name} has no experts")


def missing_module(model: "ModelSpec", modules: "tuple[RecomputeModule, ...]") -> RecomputeModule | None:
    """The first of ``modules`` that ``model`` has nothing for (experts, shared experts, MLA), or None."""
    has = {RecomputeModule.MOE: model.is_moe, RecomputeModule.MOE_ACT: model.is_moe,
           RecomputeModule.SHARED_EXPERTS: model.is_moe and model.moe_shared_experts > 0,
           RecomputeModule.MLA_UP_PROJ: model.is_mla}
    return next((m for m in modules if not has.get(RecomputeModule(m), True)), None)


def check_plan_fits(plan: "Plan", model: "ModelSpec", training: "TrainingSpec", num_gpus: int | None = None) -> None:
    """Raise MeshplanError naming the first value that does not fit the model or batch."""
    check_model_takes(model, training)
    d = plan.dims
    if num_gpus is not None and d.world_size != num_gpus:
        raise MeshplanError(
            f"degrees pp*dp_replicate*dp_shard*cp*tp = {d.pp}*{d.dp_replicate}*{d.dp_shard}"
            f"*{d.cp}*{d.tp} = {d.world_size} do not equal the GPU count {num_gpus}"
        )
    if model.num_heads % d.tp:
        raise MeshplanError(f"num_heads={model.num_heads} is not divisible by tp={d.tp}")
    if model.num_kv_heads % d.tp and d.tp % model.num_kv_heads:
        raise MeshplanError(
            f"num_kv_heads={model.num_kv_heads} and tp={d.tp}: one must divide the other"
        )
    if model.ffn_hidden_size % d.tp:
        raise MeshplanError(f"ffn_hidden_size={model.ffn_hidden_size} is not divisible by tp={d.tp}")
    if "M" in model.hybrid_pattern and (model.mamba_num_heads % d.tp or model.mamba_groups % d.tp):
        raise MeshplanError(f"Mamba-2 layers split mamba_num_heads={model.mamba_num_heads} and "
                            f"mamba_groups={model.mamba_groups} over tp: tp={d.tp} divides not both")
    if "M" in model.hybrid_pattern and (model.mamba_num_heads // d.tp) % d.cp:
        raise MeshplanError(f"Mamba-2 context parallel exchanges heads: mamba heads per tp rank "
                            f"({model.mamba_num_heads // d.tp}) are not divisible by cp={d.cp}")
    if model.is_moe:
        if model.moe_num_experts % d.ep:
            raise MeshplanError(f"moe_num_experts={model.moe_num_experts} is not divisible by ep={d.ep}")
        if plan.expert_replicas > model.moe_num_experts // d.ep:
            raise MeshplanError(f"expert_replicas={plan.expert_replicas} exceeds the "
                                f"{model.moe_num_experts // d.ep} experts each of the ep={d.ep} ranks holds")
        if d.etp and model.moe_ffn_hidden_size % d.etp:
            raise MeshplanError(f"moe_ffn_hidden_size={model.moe_ffn_hidden_size} is not divisible by "
                                f"etp={d.etp}")
    elif d.etp and d.etp != d.tp:
        raise MeshplanError(f"etp={d.etp} needs a mixture-of-experts model; {model.name} is dense")
    elif d.ep > 1:
        raise MeshplanError(f"ep={d.ep} needs a mixture-of-experts model; {model.name} is dense")
    if plan.mtp_stage is not None and not model.mtp_num_layers:
        raise MeshplanError(f"mtp_stage={plan.mtp_stage} places multi-token-prediction modules; "
                            f"{model.name} has none (mtp_num_layers=0)")
    if plan.num_stages > model.num_layers and not (
            plan.stage_layers and plan.num_stages <= model.num_layers + 2):
        raise MeshplanError(
            f"pp*vpp={plan.num_stages} stages but the model has only {model.num_layers} layers"
        )
    if plan.stage_layers and sum(plan.stage_layers) != model.num_layers:
        raise MeshplanError(
            f"stage_layers sum to {sum(plan.stage_layers)}, the model has {model.num_layers} layers"
        )
    if training.seq_len % (d.cp * (2 if d.cp > 1 else 1)):
        raise MeshplanError(
            f"seq_len={training.seq_len} is not divisible by 2*cp={2 * d.cp} "
            "(load-balanced context parallel splits the sequence into 2*cp chunks)"
        )
    if d.cp > 1 and plan.cp_method == CPMethod.ALL_TO_ALL and (model.num_heads // d.tp) % d.cp:
        raise MeshplanError(
            f"all-to-all context parallel needs heads per tp rank ({model.num_heads // d.tp}) "
            f"divisible by cp={d.cp}"
        )
    if plan.sp and training.seq_len % d.tp:
        raise MeshplanError(f"sequence parallel needs seq_len={training.seq_len} divisible by tp={d.tp}")
    missing = missing_module(model, plan.recompute_modules)
    if missing is not None:
        what = {RecomputeModule.MLA_UP_PROJ: "multi-head latent attention",
                RecomputeModule.SHARED_EXPERTS: "shared experts"}.get(missing, "experts")
        raise MeshplanError(f"recompute module {missing.value}: {model.name} has no {what}")
    if plan.mlp_splits > 1 and model.is_moe:
        raise MeshplanError(f"mlp_splits={plan.mlp_splits}: {model.name}'s experts are separate operators "
                            "already (split them with ep); operator splitting applies to dense MLPs")
    if plan.mlp_splits > 1 and model.ffn_hidden_size % (d.tp * plan.mlp_splits):
        raise MeshplanError(f"mlp_splits={plan.mlp_splits}: the MLP width per GPU "
                            f"({model.ffn_hidden_size}/{d.tp}) is not divisible by it")
    tokens = plan.micro_batch * training.seq_len // d.cp
    if plan.head_splits > 1 and tokens % plan.head_splits:
        raise MeshplanError(f"head_splits={plan.head_splits}: the {tokens} tokens of a micro-batch "
                            f"(micro_batch*seq_len/cp) are not divisible by it")
    per_step = d.dp * plan.micro_batch
    if training.global_batch % per_step:
        raise MeshplanError(
            f"global_batch={training.global_batch} is not divisible by dp*micro_batch="
            f"{d.dp}*{plan.micro_batch}={per_step}"
        )
    if plan.schedule == Schedule.INTERLEAVED_1F1B and d.pp > 1 and plan.vpp > 1:
        if plan.num_microbatches(training) % d.pp:
            raise MeshplanError(
                f"interleaved 1F1B needs the number of micro-batches "
                f"({plan.num_microbatches(training)}) divisible by pp={d.pp}"
            )
