"""OSDP (Plan.keep_gathered, mlp_splits, head_splits) in the exporters: what each stack can express.

Megatron-LM and torchtitan shard every parameter alike (torchtitan's ``fsdp_reshard_after_forward``
is one policy for all layers) and have no operator splitting: they refuse any of it. DeepSpeed
ZeRO-3 keeps every parameter smaller than ``stage3_param_persistence_threshold`` elements gathered
(never partitioned, DeepSpeed's ZeRO config docs): a threshold above the attention's largest
matrix and at most the MLP's smallest keeps exactly the attention, which is how
``keep_gathered=attention`` maps; other groups are not separable by size (the embedding and the
LM head are the largest tensors) and its config has no operator splitting.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.plan import OpGroup, Plan
from meshplan.spec.model import ModelSpec


def uses_osdp(plan: Plan) -> bool:
    return bool(plan.keep_gathered) or plan.mlp_splits > 1 or plan.head_splits > 1


def osdp_notation(plan: Plan) -> str:
    """The plan's OSDP part as in its notation (``keep=... split=...``)."""
    return " ".join(p for p in plan.notation().split() if p.startswith(("keep=", "split=")))


def persistence_config(model: ModelSpec, plan: Plan) -> dict[str, object]:
    """DeepSpeed's ``stage3_param_persistence_threshold`` for ``keep_gathered=attention``;
    nothing without OSDP; MeshplanError for what it cannot express."""
    if not uses_osdp(plan):
        return {}
    if plan.mlp_splits > 1 or plan.head_splits > 1:
        raise MeshplanError(f"DeepSpeed's config has no operator splitting ({osdp_notation(plan)}); "
                            "plan with mlp_splits=1 and head_splits=1")
    if set(plan.keep_gathered) != {OpGroup.ATTENTION} or model.is_moe or model.is_mla or model.is_hybrid:
        raise MeshplanError("DeepSpeed keeps parameters gathered by size (stage3_param_persistence_threshold): "
                            "only keep_gathered=attention of a dense attention + MLP model is expressible, "
                            f"not {osdp_notation(plan)} on {model.name}")
    D = model.hidden_size
    largest_attention = max(D * model.q_size, D * model.kv_size, model.q_size * D)
    smallest_mlp = D * model.ffn_hidden_size
    if largest_attention >= smallest_mlp:
        raise MeshplanError(f"{model.name}: its attention matrices ({largest_attention} elements) are not "
                            f"smaller than its MLP's ({smallest_mlp}); DeepSpeed cannot keep one and not the other")
    return {"stage3_param_persistence_threshold": largest_attention + 1}


__all__ = ["uses_osdp", "osdp_notation", "persistence_config"]
