"""What each training stack can run: one set of rules shared by the search, the runtime's own
pre-launch check and ``--target`` on the CLI.

A rule is a vectorised predicate over global configurations (the search's struct of arrays:
``pp, dp_replicate, dp_shard, cp, tp, ep, zero, sp, schedule, vpp, micro_batch, recompute,
cp_method`` with enum codes in the order of the enums) plus the one line that says why a plan it
refuses cannot run. The search keeps the rows no rule refuses (``runnable_mask``); the runtime asks
:func:`why_not` about the one plan it is given. Since both read the same rules, a plan the search
writes for a target is a plan that target accepts.

Only meshplan's own runtime is described here rule by rule; the exporters check what Megatron-LM,
torchtitan and DeepSpeed can express (``meshplan.export``), and ``search_options`` takes their
restrictions from there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.plan import (
    OFFLOAD_ACTIVATIONS_BIT, OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT, OpGroup, Recompute, RecomputeModule,
    Schedule,
)

if TYPE_CHECKING:
    from meshplan.plan import Plan
    from meshplan.search.space import SearchOptions
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec

_SCHEDULES = tuple(Schedule)
_RECOMPUTES = tuple(Recompute)


class Target(str, enum.Enum):
    """A training stack a plan is made for (``--target``)."""

    MESHPLAN = "meshplan"  # this project's runtime (`meshplan train`)
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"


def plan_target(given: Target | None, planned_for: str | None) -> Target:
    """The stack a command estimates a Job file's plan for: ``--target`` when given, else the one
    the file was planned for (``Job.target``), else meshplan's runtime."""
    if given is not None:
        return given
    if planned_for is None:
        return Target.MESHPLAN
    try:
        return Target(planned_for)
    except ValueError:
        raise MeshplanError(f"plan file's target {planned_for!r} is not one of "
                            f"{', '.join(t.value for t in Target)}") from None


@dataclass(frozen=True)
class Rule:
    """One thing a stack cannot run."""

    refuses: Callable[[Any, "ModelSpec", "TrainingSpec"], np.ndarray]
    """(configs, model, training) -> bool per row, True where the stack cannot run the row."""
    reason: Callable[["Plan", "ModelSpec", "TrainingSpec"], str]
    """The one line for a refused plan."""


ZERO_BUBBLE_RECOMPUTE = (
    "zero-bubble with recompute is not supported: its split backward (input grads, then weight "
    "grads) recomputes each checkpointed layer twice, which torch's composable checkpoint used by "
    "this runtime cannot do (torch 2.13); use interleaved-1f1b or recompute 'none'"
)


VOCAB_PARALLEL_SCHEDULE = (
    "vocabulary parallelism runs with the gpipe or 1f1b schedule (vpp=1) in this runtime: its output "
    "pass runs on every pipeline rank before each micro-batch's backward, placed per stage, not per "
    "virtual stage; use --schedule 1f1b"
)


def _vocab(c) -> np.ndarray:
    return np.asarray(c.vocab_parallel, dtype=bool)


def _microbatches(c, training: "TrainingSpec") -> np.ndarray:
    return training.global_batch // (c.dp_replicate * c.dp_shard * c.micro_batch)


def _code(values: tuple, member) -> int:
    return values.index(member)


def _interleaved(c) -> np.ndarray:
    return np.isin(c.schedule, [_code(_SCHEDULES, Schedule.INTERLEAVED_1F1B),
                                _code(_SCHEDULES, Schedule.ZERO_BUBBLE)])


def _pp_rounds_refuse(c, model, training) -> np.ndarray:
    # torch's multi-stage schedules group micro-batches in rounds of pp and need their count to
    # be a multiple of max(1, m // pp) (torch.distributed.pipelining, torch 2.6-2.13)
    m = _microbatches(c, training)
    rounds = np.maximum(1, m // np.maximum(c.pp, 1))
    return (c.pp > 1) & _interleaved(c) & (m % rounds != 0)


def _rounds_reason(plan, model, training) -> str:
    m = plan.num_microbatches(training)
    pp = plan.dims.pp
    return (f"{plan.schedule.value} with pp={pp} needs the {m} micro-batches per step to be a "
            f"multiple of the number of rounds max(1, n_microbatches // pp) = {max(1, m // pp)}")


RUNTIME_RECOMPUTE_MODULES = frozenset({RecomputeModule.CORE_ATTN, RecomputeModule.MLP, RecomputeModule.MOE})
"""The recompute modules the runtime checkpoints (runtime/parallelize.py ``selective_modules``):
the ones Megatron-Core checkpoints whole. Its output-discarding ones (moe_act, layernorm,
mla_up_proj) and shared_experts have no counterpart there."""
_RUNTIME_MODULES_MASK = sum(m.bit for m in RUNTIME_RECOMPUTE_MODULES)


def _modules_refuse(c, model, training) -> np.ndarray:
    modules = np.asarray(c.recompute_modules)
    return (c.recompute == _code(_RECOMPUTES, Recompute.SELECTIVE)) & ((modules & ~_RUNTIME_MODULES_MASK) > 0)


def _modules_reason(plan, model, training) -> str:
    other = next(m for m in plan.recompute_modules if m not in RUNTIME_RECOMPUTE_MODULES)
    return (f"recompute module {other.value!r} is not supported by this runtime (it checkpoints "
            f"{', '.join(sorted(m.value for m in RUNTIME_RECOMPUTE_MODULES))} whole, and has no "
            "output-discarding checkpoint); plan without it, or with --target megatron")


PLANNER_ONLY: tuple[tuple[Callable[["ModelSpec"], bool], str], ...] = (
    (lambda m: m.arch.value != "decoder", "an encoder (the runtime trains decoder models only)"),
    (lambda m: m.is_hybrid, "hybrid Mamba-2 layers (hybrid_pattern)"),
    (lambda m: m.sliding_window > 0, "sliding-window attention"),
    (lambda m: bool(m.attention_sinks), "attention sinks"),
    (lambda m: m.mtp_num_layers > 0, "multi-token prediction (mtp_num_layers)"),
    (lambda m: m.moe_latent_size > 0, "LatentMoE (moe_latent_size)"),
)
"""Architectures the planner models but the runtime's reference models do not build (yet)."""


def planner_only_feature(model: "ModelSpec") -> str | None:
    """What in ``model`` meshplan's runtime cannot build, or None."""
    return next((feature for present, feature in PLANNER_ONLY if present(model)), None)


def _planner_only_reason(p, model, tr) -> str:
    return (f"{model.name}: {planner_only_feature(model)} is planner-only; the runtime cannot train it "
            "(plan with --target megatron, or another stack that has it)")


MESHPLAN_RULES: tuple[Rule, ...] = (
    Rule(lambda c, model, tr: np.full(c.tp.shape, planner_only_feature(model) is not None), _planner_only_reason),
    Rule(lambda c, model, tr: np.full(c.tp.shape, model.is_mla) & c.sp.astype(bool),
         lambda p, model, tr: ("multi-head latent attention with sequence parallel is not supported by "
                               "this runtime; use tp without sp")),
    Rule(lambda c, model, tr: (c.tp > 1) & (model.vocab_size % c.tp != 0),
         lambda p, model, tr: f"vocab_size={model.vocab_size} is not divisible by tp={p.dims.tp}"),
    Rule(lambda c, model, tr: np.full(c.tp.shape, model.is_moe) & (c.tp > 1) & c.sp.astype(bool),
         lambda p, model, tr: ("MoE with tensor + sequence parallel is not supported by this runtime (its "
                               "experts need the whole sequence on every tp rank); use tp without sp, or ep "
                               "over dp_shard*cp")),
    # torch's Schedule1F1B needs at least as many micro-batches as stages
    Rule(lambda c, model, tr: (c.pp > 1) & (c.schedule == _code(_SCHEDULES, Schedule.ONE_F_ONE_B))
         & (_microbatches(c, tr) < c.pp),
         lambda p, model, tr: (f"1F1B with pp={p.dims.pp} needs at least {p.dims.pp} micro-batches per "
                               f"step, the plan has {p.num_microbatches(tr)} (global_batch / (dp * "
                               "micro_batch)); use gpipe or a smaller micro_batch")),
    Rule(lambda c, model, tr: (c.pp > 1) & (c.schedule == _code(_SCHEDULES, Schedule.ZERO_BUBBLE))
         & (c.recompute != _code(_RECOMPUTES, Recompute.NONE)),
         lambda p, model, tr: ZERO_BUBBLE_RECOMPUTE),
    Rule(_pp_rounds_refuse, _rounds_reason),
    Rule(_modules_refuse, _modules_reason),
    # vocabulary parallelism (runtime/vocab_parallel.py): GPipe or 1F1B, shards over pp (not tp)
    Rule(lambda c, model, tr: _vocab(c) & ((c.vpp > 1) | ~np.isin(c.schedule, [
             _code(_SCHEDULES, Schedule.GPIPE), _code(_SCHEDULES, Schedule.ONE_F_ONE_B)])),
         lambda p, model, tr: VOCAB_PARALLEL_SCHEDULE),
    Rule(lambda c, model, tr: _vocab(c) & (c.tp > 1),
         lambda p, model, tr: (f"vocabulary parallelism with tp={p.dims.tp} is not supported by this runtime "
                               "(its vocabulary shards split over pp only, not over tp); use tp=1")),
    Rule(lambda c, model, tr: _vocab(c) & ((np.asarray(c.keep) & (OpGroup.EMBEDDING.bit | OpGroup.HEAD.bit)) > 0),
         lambda p, model, tr: ("keeping the embedding or head gathered (OSDP) with vocabulary parallelism is not "
                               "supported by this runtime (its vocabulary shards are one FSDP2 unit of their own, "
                               "under the plan's zero); keep attention/mlp only")),
    Rule(lambda c, model, tr: _vocab(c) & (model.vocab_size % np.maximum(c.pp, 1) != 0),
         lambda p, model, tr: (f"vocabulary parallelism needs vocab_size={model.vocab_size} divisible by "
                               f"pp={p.dims.pp}")),
    # FSDP2's only offload policy moves parameters, gradients and the optimizer step together
    Rule(lambda c, model, tr: (np.asarray(c.offload) & (OFFLOAD_OPTIMIZER_BIT | OFFLOAD_PARAMS_BIT))
         == OFFLOAD_OPTIMIZER_BIT,
         lambda p, model, tr: ("offloading the optimizer states alone is not supported by this runtime: FSDP2's "
                               "CPUOffloadPolicy moves parameters, gradients and optimizer states together; "
                               "use offload optimizer+params with zero 3 (or --target deepspeed/megatron)")),
    Rule(lambda c, model, tr: ((np.asarray(c.offload) & OFFLOAD_PARAMS_BIT) > 0)
         & (c.dp_replicate * c.dp_shard * c.cp == 1),
         lambda p, model, tr: ("offload params needs data-parallel sharding in this runtime (FSDP2's "
                               "CPUOffloadPolicy): dp_shard*cp must be above 1")),
    # its save_on_cpu hooks wrap every layer (runtime): no count of layers (Megatron's cpu_offloading_num_layers)
    Rule(lambda c, model, tr: np.asarray(c.offload_layers) > 0,
         lambda p, model, tr: (f"offload_layers={p.offload_layers} (activations of only some layers offloaded) is "
                               "not supported by this runtime: its save_on_cpu hooks take every layer; use "
                               "offload_layers=0")),
    Rule(lambda c, model, tr: ((np.asarray(c.offload) & OFFLOAD_ACTIVATIONS_BIT) > 0) & (c.pp > 1),
         lambda p, model, tr: ("activation offload with pipeline parallel is not supported by this runtime "
                               "(torch's pipeline schedules run the stage forwards outside its save_on_cpu "
                               "hooks); use pp=1")),
    # packed documents (issue 18): the document layout is set per micro-batch on the attention cores
    Rule(lambda c, model, tr: np.full(c.tp.shape, tr.seq_len_dist is not None) & ((c.pp > 1) | (c.cp > 1)),
         lambda p, model, tr: ("packed documents (--seq-len-dist) train with pp=1 and cp=1 in this runtime (its "
                               "pipeline schedules and ring/all-to-all attention take no document layout, so "
                               "per-bucket cp is planner-only); plan without pp and cp")),
    Rule(lambda c, model, tr: np.full(c.tp.shape, tr.seq_len_dist is not None and model.position.value == "learned"),
         lambda p, model, tr: (f"packed documents restart positions at each document; {model.name} has learned "
                               "position embeddings, which this runtime does not restart (use a RoPE model)")),
    Rule(lambda c, model, tr: np.full(c.tp.shape, tr.doc_balance.value == "ideal"),
         lambda p, model, tr: ("doc_balance 'ideal' is the estimate's bound (every rank the mean attention work), "
                               "not an assignment a run can make; use stream or balanced")),
    # OSDP (runtime.osdp): MLP slices and the chunked LM head are built on whole (unsplit) tensors
    Rule(lambda c, model, tr: (np.asarray(c.mlp_splits) > 1) & (c.tp > 1),
         lambda p, model, tr: (f"mlp_splits={p.mlp_splits} with tp={p.dims.tp} is not supported by this runtime "
                               "(its MLP slices are not tensor parallel); use tp=1 or mlp_splits=1")),
    Rule(lambda c, model, tr: (np.asarray(c.head_splits) > 1) & ((c.tp > 1) | (c.pp > 1)),
         lambda p, model, tr: (f"head_splits={p.head_splits} with tp={p.dims.tp}, pp={p.dims.pp} is not supported "
                               "by this runtime (its chunked LM head and loss run on whole logits rows, outside "
                               "the pipeline's loss function); use tp=1 and pp=1, or head_splits=1")),
    Rule(lambda c, model, tr: np.asarray(c.expert_balanced, dtype=bool) | (np.asarray(c.expert_replicas) > 0),
         lambda p, model, tr: ("placing experts by their load and replicating hot experts is planner-only: this "
                               "runtime holds experts [r*E/ep, (r+1)*E/ep) on ep rank r; plan with "
                               "--expert-placement contiguous --expert-replicas 0 (its routing log shows the load)")),
    Rule(lambda c, model, tr: np.asarray(c.etp) != np.asarray(c.tp),
         lambda p, model, tr: (f"expert tensor parallel etp={p.dims.etp} different from tp={p.dims.tp} is not "
                               "supported by this runtime (planner and Megatron export only); use etp=0 (as tp)")),
)
"""What `meshplan train` cannot run (the runtime's own limits, torch 2.13)."""


def rules_for(target: Target | str) -> tuple[Rule, ...]:
    """The rules of ``target`` kept here (meshplan's runtime; the exporters check the others)."""
    return MESHPLAN_RULES if Target(target) == Target.MESHPLAN else ()


def runnable_mask(target: Target | str, configs, model: "ModelSpec", training: "TrainingSpec") -> np.ndarray:
    """True for each row of ``configs`` that ``target`` can run."""
    ok = np.ones(np.shape(configs.tp), dtype=bool)
    for rule in rules_for(target):
        ok &= ~np.asarray(rule.refuses(configs, model, training), dtype=bool)
    return ok


def why_not(target: Target | str, model: "ModelSpec", training: "TrainingSpec", plan: "Plan") -> str | None:
    """The first reason ``target`` cannot run ``plan`` (for this model and batch), or None."""
    from meshplan.cost.arrays import PlanArrays

    plan = plan.with_defaults(model)  # recomputing zero layers is no recompute
    row = PlanArrays.from_plans([plan])
    for rule in rules_for(target):
        if bool(np.asarray(rule.refuses(row, model, training))[0]):
            return rule.reason(plan, model, training)
    return None


def check_runs(target: Target | str, model: "ModelSpec", training: "TrainingSpec", plan: "Plan") -> None:
    """Raise MeshplanError when ``target`` cannot run ``plan``."""
    reason = why_not(target, model, training, plan)
    if reason is not None:
        raise MeshplanError(reason)


def search_options(target: Target | str, model: "ModelSpec", training: "TrainingSpec") -> "SearchOptions":
    """The part of the search space ``target`` can run."""
    from meshplan.search.space import SearchOptions

    target = Target(target)
    if target == Target.MESHPLAN:
        if planner_only_feature(model) is not None:  # no plan at all: say why, not "no legal plan"
            raise MeshplanError(_planner_only_reason(None, model, training))
        # its pipeline cuts a stage holding only the embedding or the loss as any other
        # (runtime/pipeline.py cut_stage; tests/runtime/test_pipeline_embedding_chunks.py)
        return SearchOptions(allow=lambda space: runnable_mask(target, space, model, training),
                             embedding_loss_chunks=True)
    from meshplan.export.common import search_options_for

    return search_options_for(target.value)
