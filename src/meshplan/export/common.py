"""The dispatch by target name, and the search a target can express (``export --best``).

The exporters import only ``export.base``; this module imports them (no cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from meshplan.export.base import Export, ExportTarget, uniform_recompute
from meshplan.export.deepspeed import export_deepspeed
from meshplan.export.megatron import export_megatron
from meshplan.export.megatron_bridge import export_megatron_bridge
from meshplan.export.torchtitan_cli import export_torchtitan_for
from meshplan.plan import RecomputeModule

if TYPE_CHECKING:
    from meshplan.plan import Job
    from meshplan.search.space import SearchOptions

__all__ = ["Export", "ExportTarget", "best_expressible", "export_job", "search_options_for", "uniform_recompute"]


def export_job(job: "Job", target: ExportTarget | str, version: str | None = None) -> Export:
    """Export ``job`` to ``target`` (for the target's ``version`` where its form depends on it:
    torchtitan); raises MeshplanError for what the target cannot express."""
    target = ExportTarget(target)
    if target == ExportTarget.TORCHTITAN:
        return export_torchtitan_for(job, version)
    fn = {ExportTarget.MEGATRON: export_megatron, ExportTarget.MEGATRON_BRIDGE: export_megatron_bridge,
          ExportTarget.DEEPSPEED: export_deepspeed}[target]
    return fn(job)


MEGATRON_MODULE_SETS: tuple[tuple[RecomputeModule, ...], ...] = (
    (RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),  # GPT-OSS-120B, Nemotron-3-Super
    (RecomputeModule.CORE_ATTN, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),
    (RecomputeModule.MLA_UP_PROJ,),  # DeepSeek-V3, Kimi-K2
    (RecomputeModule.MOE_ACT,),  # DeepSeek-V3 GB300 BF16 V1
    (RecomputeModule.MLA_UP_PROJ, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),  # DeepSeek-V3 B300 BF16 V2
    (RecomputeModule.MLP, RecomputeModule.MLA_UP_PROJ),  # DeepSeek-V3 H100, Kimi-K2
    (RecomputeModule.MOE, RecomputeModule.LAYERNORM),  # Nemotron-3-Nano
    (RecomputeModule.CORE_ATTN, RecomputeModule.MOE, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),  # Nemotron-3
)
"""The ``--recompute-modules`` sets the Megatron target's search tries on MoE models beside the
default attention core: every set a Megatron-Bridge MoE preset uses (data/bridge_recipes.csv, one
row per preset with its path@commit: scripts/performance/configs/deepseek/
deepseek_workload_base_configs.py@f0e2c37, gpt_oss/gpt_oss_workload_base_configs.py@1e7adfa,
nemotronh/nemotron_3_workload_base_configs.py@f601ba9), of the modules Megatron-Core offers
(``RecomputeModule``: TransformerConfig.recompute_modules, Megatron-LM@d30c3ae), each tried
where the model has its modules (``plan.missing_module``: mla_up_proj needs MLA) and once per
cost (``search.space.cost_module_code``: moe holds moe_act). Not every subset of the seven
modules: each set is one more copy of the selective rows of an MoE search (see bench/bench_search.py
for the MoE times)."""


MEGATRON_COUNTED_ACTIVATION_OFFLOAD = False
"""Whether the megatron targets search activation offload of a count of layers
(``SearchOptions.offload_layer_counts``, ``search.offload``). Off (issue 15: no gain from a term
the measured rows show wrong): the 12 Megatron-Bridge rows that offload activations (Llama 3 70B /
3.1 405B on GB200 / GB300) are estimated 6.1% faster than measured (median signed error) against
-2.1% for the 55 other dense GB200 / GB300 rows, and pricing the copies at the node's shared host
DRAM and Transformer Engine's offload schedule (cost.offload) leaves that gap as it was (the copies
stay hidden behind the passes); with it on, the search recommended activation offload in 71 Bridge
rows. Turned on, the search reaches the published plans (docs/search.md, Session 13: offload13)."""


def search_options_for(target: "ExportTarget | str") -> "SearchOptions":
    """The part of the search space a target can express at all, so that ``--best`` searches
    it instead of hoping the unrestricted frontier holds an expressible point. Conditional
    limits (DeepSpeed: ZeRO <= 1 with a pipeline) are still checked by the exporter itself."""
    from meshplan.plan import Offload, Recompute, Schedule
    from meshplan.search.space import SearchOptions

    opt, par, act = Offload.OPTIMIZER, Offload.PARAMS, Offload.ACTIVATIONS
    # what each stack offloads (the exporters' own rules): Megatron the distributed optimizer and
    # the activations of a count of layers (--cpu-offloading-num-layers, searched:
    # SearchOptions.offload_layer_counts; the Megatron-Bridge Llama 3 70B / 3.1 405B GB200 / GB300
    # recipes offload 20 to 92 layers), DeepSpeed ZeRO-Offload and ZeRO-Infinity's parameters,
    # torchtitan FSDP2's CPUOffloadPolicy
    megatron_offloads = ((opt,), (act,), (opt, act)) if MEGATRON_COUNTED_ACTIVATION_OFFLOAD else ((opt,),)
    offloads = {ExportTarget.MEGATRON: megatron_offloads, ExportTarget.MEGATRON_BRIDGE: megatron_offloads,
                ExportTarget.DEEPSPEED: ((opt,), (opt, par)), ExportTarget.TORCHTITAN: ((opt, par),)}
    if ExportTarget(target) == ExportTarget.DEEPSPEED:
        # DeepSpeed's pipeline engine runs 1F1B, has no virtual stages, no context parallel and
        # checkpoints whole layers (docs/interop.md).
        # Its pipeline engine takes ZeRO 0-1 only, AutoTP ZeRO 0-2, and no hybrid sharding
        # (the exporter's own rules).
        return SearchOptions(schedules=(Schedule.ONE_F_ONE_B,), max_vpp=1, max_cp=1,
                             recomputes=(Recompute.NONE, Recompute.FULL), allow=_deepspeed_runs,
                             offloads=offloads[ExportTarget.DEEPSPEED], vocab_parallel=False,
                             expert_placement=False, osdp=False)
    # no stack runs vocabulary parallelism over pipeline ranks (Yeung et al. 2024 is a Megatron fork),
    # nor places experts by their load (each puts ids [r*E/ep, (r+1)*E/ep) on ep rank r)
    # per operator-group sharding and operator splits (OSDP) neither (export.osdp)
    megatron = ExportTarget(target) in (ExportTarget.MEGATRON, ExportTarget.MEGATRON_BRIDGE)
    allow = _torchtitan_runs if ExportTarget(target) == ExportTarget.TORCHTITAN else (
        _megatron_runs if megatron else None)
    return SearchOptions(offloads=offloads[ExportTarget(target)], vocab_parallel=False, expert_placement=False,
                         osdp=False, allow=allow, recompute_module_sets=MEGATRON_MODULE_SETS if megatron else (),
                         offload_layer_counts=megatron and MEGATRON_COUNTED_ACTIVATION_OFFLOAD,
                         embedding_loss_chunks=True,
                         allow_split=_megatron_splits if megatron else _whole_stage_recompute)
    # both run stages holding only the embedding or the loss: Megatron under
    # --account-for-embedding/loss-in-pipeline-split, torchtitan as its own default split gives them
    # with L + 2 stages (generate_llm_fqn_per_model_part, input_weight = output_weight = 1:
    # torchtitan/distributed/pipeline_parallel.py@1ce7f76; export.torchtitan_cli writes the parts)


def _torchtitan_runs(space) -> "object":
    # torchtitan 0.3's experts follow the dense tp (no expert tensor parallel degree of its own);
    # it applies FSDP whenever dp_shard x cp > 1, so no zero 0 with context parallel (export.torchtitan)
    return (space.etp == space.tp) & ((space.dp_shard * space.cp == 1) | (space.zero >= 1))


def _megatron_runs(space) -> "object":
    # ZeRO-3 is Megatron-LM's --use-torch-fsdp2, which the exporter writes only without pipeline
    # parallel and without replicas (export.megatron.megatron_args refuses the rest): a plan
    # searched for Megatron is one its exporter writes (issue 15: a plan for a target runs on it)
    # and offloads the optimizer only from the distributed optimizer (zero 1: Megatron shards it
    # over data-parallel x context-parallel ranks, export/megatron.py).
    # No zero 2: Megatron's distributed optimizer reduce-scatters gradients but keeps the full
    # gradient buffer (DistributedDataParallel's grad_data over every parameter), i.e. ZeRO-1
    # memory, so a zero-2 plan would be estimated leaner than Megatron runs it; zero 1 is that plan.
    # Activation offload (--cpu-offloading) runs without pipeline parallel and without recompute,
    # for a count of layers 1..num_layers-1 (export.megatron refuses the rest; Megatron-Bridge's
    # docs, 'CPU Offloading': cpu_offloading_num_layers below num_layers): the search gives every
    # such variant its count (search.offload).
    from meshplan.cost.arrays import RC_NONE
    from meshplan.plan import OFFLOAD_ACTIVATIONS_BIT, OFFLOAD_OPTIMIZER_BIT

    fsdp_ok = (space.zero != 3) | ((space.pp == 1) & (space.dp_replicate == 1))
    act_ok = (((space.offload & OFFLOAD_ACTIVATIONS_BIT) == 0)
              | ((space.pp == 1) & (space.recompute == RC_NONE) & (space.offload_layers > 0)))
    return (fsdp_ok & act_ok & (space.zero != 2)
            & (((space.offload & OFFLOAD_OPTIMIZER_BIT) == 0) | (space.zero == 1)))


def _whole_stage_recompute(plans, layers, recomputed) -> "object":
    """Every rank recomputes all its layers or none of them: Megatron's and torchtitan's selective
    recompute covers every layer (export.megatron._recompute_args, export.torchtitan). torchtitan's
    every-k-th-block full recompute and Megatron's block method are the other forms they run; the
    first is not searched (a narrower space, not a wrong plan), the second is _megatron_splits'."""
    return (recomputed == layers).all(axis=1) | (recomputed == 0).all(axis=1)


def _megatron_splits(plans, layers, recomputed) -> "object":
    """Besides whole stages: full recompute by Megatron's block method, the first k layers of every
    (virtual) stage (--recompute-method block --recompute-num-layers k: min(k, n) of a stage of n).
    Per rank, as the search counts them, that is the stage itself only without interleaving (with
    it the search fills a rank's recomputed layers from its first chunk, not k per chunk)."""
    import numpy as np

    from meshplan.plan import Recompute
    from meshplan.search.options import RECOMPUTES

    k = recomputed.max(axis=1, keepdims=True)
    block = (recomputed == np.minimum(k, layers)).all(axis=1)
    full = plans.recompute == RECOMPUTES.index(Recompute.FULL)
    return _whole_stage_recompute(plans, layers, recomputed) | (full & (plans.vpp == 1) & block)


def _deepspeed_runs(space) -> "object":
    # AutoTP has no sequence parallel, so sp plans would need more activation memory than planned;
    # hybrid sharding (replicas of shards) was ZeRO-3 MiCS, removed in DeepSpeed 0.19.
    hybrid = (space.dp_replicate > 1) & (space.dp_shard > 1)
    return (((space.pp == 1) | (space.zero <= 1)) & ((space.tp == 1) | (space.zero <= 2))
            & ~space.sp & ~hybrid & (space.etp == space.tp))


def best_expressible(job: "Job", frontier: Sequence[object], target: "ExportTarget | str",
                     budget_gib: float, version: str | None = None) -> "tuple[int, Export] | None":
    """Fastest frontier point within the budget that ``target`` can express: (index, export).

    ``frontier`` holds the search's points (fastest first; each has ``plan`` and
    ``peak_memory_gib``); ``job`` supplies the model, batch and cluster they were searched for.
    """
    from dataclasses import replace

    from meshplan.errors import MeshplanError

    for i, point in enumerate(frontier):
        if point.peak_memory_gib > budget_gib:  # type: ignore[attr-defined]
            continue
        try:
            return i, export_job(replace(job, plan=point.plan), target, version)  # type: ignore[attr-defined]
        except MeshplanError:
            continue
    return None

