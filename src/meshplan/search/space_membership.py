"""Whether a given plan is in the space (:func:`in_space`), the first rule it breaks
(:func:`why_outside`), and the space's form of an equivalent plan (:func:`canonical`)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.plan import CPMethod, Plan, Schedule
from meshplan.search.options import MAX_VPP, SearchOptions
from meshplan.search.space import cost_module_code, embedding_loss_vpp, module_codes
from meshplan.search.space_rules import (_rule_cp_method, _rule_degrees, _rule_ep, _rule_max_cp,
                                         _rule_micro_batch, _rule_schedule, _rule_sp, _rule_zero)
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def canonical(plan: Plan) -> Plan:
    """The plan the space holds for an equivalent one: ZeRO over a single shard is stage 0, a
    schedule with pp == 1 (or interleaved 1F1B with one chunk) is 1F1B, the CP method with
    cp == 1 is ring."""
    from dataclasses import replace

    d = plan.dims
    out = plan
    if d.dp_shard * d.cp == 1 and plan.zero:
        out = replace(out, zero=0)
    if (d.pp == 1 and out.schedule != Schedule.ONE_F_ONE_B) or (
            out.schedule == Schedule.INTERLEAVED_1F1B and out.vpp == 1):
        out = replace(out, schedule=Schedule.ONE_F_ONE_B, vpp=1)  # interleaving one chunk is 1F1B
    if d.cp == 1 and out.cp_method != CPMethod.RING:
        out = replace(out, cp_method=CPMethod.RING)
    return out


def in_space(model: ModelSpec, training: TrainingSpec, num_gpus: int, plan: Plan,
             options: SearchOptions = SearchOptions()) -> bool:
    """Whether the global configuration of ``plan`` is one ``enumerate_space`` lists (same rules,
    one row; the layer split is the stage search's business)."""
    g = PlanArrays.from_plans([plan])
    c = {f.name: getattr(g, f.name) for f in fields(PlanArrays)}
    d = plan.dims
    if d.world_size != num_gpus or plan.recompute not in options.recomputes:
        return False
    code = cost_module_code(plan.recompute_modules)
    if code and code not in module_codes(model, options):
        return False
    ok = (_rule_degrees(c, model, training) & _rule_max_cp(c, options) & _rule_zero(c) & _rule_sp(c, training)
          & _rule_cp_method(c, model, options) & _rule_ep(c, model)
          & _rule_schedule_or_embedding(c, model, plan, options) & _rule_micro_batch(c, training))
    return bool(ok[0]) and training.global_batch % plan.micro_batch == 0


def _rule_schedule_or_embedding(c, model: ModelSpec, plan: Plan, options: SearchOptions) -> np.ndarray:
    """``_rule_schedule``, or the embedding / loss layout (:func:`embedding_loss_vpp`) with its
    one split (``plan.embedding_loss_split``; an empty split is filled with it)."""
    from meshplan.plan import embedding_loss_split

    v = int(embedding_loss_vpp(model, c["pp"], options)[0])
    own = (plan.schedule == Schedule.INTERLEAVED_1F1B and v == plan.vpp and (
        not plan.stage_layers or tuple(plan.stage_layers) == embedding_loss_split(model.num_layers, plan.dims.pp * v)))
    return _rule_schedule(c, model, options) | own


def why_outside(model: ModelSpec, training: TrainingSpec, num_gpus: int, plan: Plan,
                options: SearchOptions = SearchOptions()) -> str | None:
    """The first rule of the space that ``plan`` (taken canonical) breaks, in words, or None when
    ``in_space`` holds it: what `bench/bench_experts.py` says of a published plan the search
    cannot propose."""
    plan = canonical(plan)
    g = PlanArrays.from_plans([plan])
    c = {f.name: getattr(g, f.name) for f in fields(PlanArrays)}
    if plan.dims.world_size != num_gpus:
        return f"the plan uses {plan.dims.world_size} GPUs, the job {num_gpus}"
    if plan.recompute not in options.recomputes:
        return f"recompute {plan.recompute.value} is not searched for this target"
    code = cost_module_code(plan.recompute_modules)
    if code and code not in module_codes(model, options):
        return (f"recompute modules {'+'.join(m.value for m in plan.recompute_modules)} are not searched "
                "for this target and model")
    if training.global_batch % plan.micro_batch:
        return f"micro-batch {plan.micro_batch} does not divide the global batch {training.global_batch}"
    rules = (
        (_rule_degrees(c, model, training), "tp must divide the heads, FFN and KV heads; pp <= layers; "
                                            "dp divides the batch; seq divisible by 2*cp"),
        (_rule_max_cp(c, options), "context parallel is not available on this target"),
        (_rule_zero(c), "ZeRO stage and sharding degree disagree"),
        (_rule_sp(c, training), "sequence parallel needs tp > 1 dividing the sequence"),
        (_rule_cp_method(c, model, options), "the CP method is not searched (or heads/tp not divisible by cp)"),
        (_rule_ep(c, model), "expert parallel must fold onto dp_shard x cp x tp and divide the experts"),
        (_rule_schedule_or_embedding(c, model, plan, options),
         f"schedule {plan.schedule.value} with pp={plan.dims.pp}, vpp={plan.vpp} is not searched (pp*vpp "
         f"chunks <= the {model.num_layers} layers, vpp <= {MAX_VPP} or chunks dividing the layers"
         + (f"; or {model.num_layers + 2} chunks with the embedding and the loss on chunks of their own, "
            "not for models with leading dense layers or MTP modules"
            if options.embedding_loss_chunks else "; more chunks than layers not for this target") + ")"),
        (_rule_micro_batch(c, training), "interleaving needs the micro-batch count to be a multiple of pp"),
    )
    return next((why for ok, why in rules if not bool(np.asarray(ok)[0])), None)
