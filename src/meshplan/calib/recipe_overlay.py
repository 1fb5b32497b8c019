"""What a Megatron-Bridge row takes from the preset it ran (``calib/recipes.py`` reads the presets).

A Megatron-Bridge row whose key matches a preset takes the settings meshplan can express where
the row leaves the field blank (:func:`overlay`):

* ``use_megatron_fsdp`` -> ZeRO stage 3 (Megatron FSDP's ``optim_grads_params`` sharding);
* ``recompute_num_layers=N`` -> full recompute of the first N layers of each (virtual) stage
  (Megatron-Core's ``block`` method, as ``export.import_megatron`` reads it);
* ``recompute_modules`` -> selective recompute of those modules (``Plan.recompute_modules``,
  costed per module in ``cost/recompute_modules.py``); a name Megatron-Core does not know is an
  error of the file;
* ``cpu_offloading_num_layers=N`` -> activations of N layers in host memory
  (``Plan.offload_layers``).

and, for its expert all-to-all (issue 14 items 2 and 6), Calibration values over the row's (the
way a stack release's values are applied, ``Run.release_values``, so the fit sees them):

* ``moe_a2a_overlap`` off (``WorkloadBaseConfig``'s default; on, the preset sets
  ``comm_overlap.overlap_moe_expert_parallel_comm``) -> ``ep_overlap`` 0: the dispatch and combine
  run exposed; on -> the stack's (fitted) overlap;
* ``moe_token_dispatcher_type`` flex with the ``hybridep`` backend -> the training's
  ``moe_dispatcher`` flex (``Overlay.moe_dispatcher``, not a Calibration value): a token travels
  once per picked rank, not once per routed copy (cost/moe.py), and no per-layer host sync of the
  token counts is charged (cost/layer.py charges it to the alltoall dispatcher only): HybridEP
  sizes its buffers on the device (the presets that set it graph the router and the preprocess,
  ``cuda_graph_scope`` moe_router/moe_preprocess). DeepEP's normal kernels send per rank too
  (and across nodes once per destination node, forwarded over NVLink: DeepSeek-V3 report Sec.
  3.2.2), but their dispatch waits on the host for the received counts: a ``deepep`` preset runs
  the flex dispatcher with ``moe_flex_host_sync`` (the per-layer sync charged as for alltoall)
  and NCCL's fitted NVLink efficiency (DeepSeek-V3's B200 ``FP8_MX_V2`` preset, pp8 ep32).
* the ``hybridep`` backend also -> ``moe_dispatch_nvlink_efficiency`` HYBRIDEP_NVLINK_EFFICIENCY:
  its dispatch and combine inside the NVLink domain run at HybridEP's bandwidth, not NCCL's
  fitted ``intra_node_comm_efficiency``. Tokens travel in bf16 under fp8 presets too:
  Megatron-Core's HybridEP path builds its buffer with ``fp8_dispatch = False`` ("Currently, we
  do not support fp8 dispatch", megatron/core/transformer/moe/fused_a2a.py@02ad939), and the
  combine is bf16 in every backend.

Blank: the file was not read for it, the stack's value stands.

and, for its data-parallel gradient reduction, the training's ``overlap_grad_reduce``
(``Overlay.overlap_grad_reduce``, ``TrainingSpec.overlap_grad_reduce``): 0 -> the reduction runs
after the backward, exposed; 1 -> overlapped, at the stack's fitted ``dp_overlap``. Megatron-
Bridge's ``CommOverlapConfig`` turns ``overlap_grad_reduce`` / ``overlap_param_gather`` on whenever
the run has data parallelism over the distributed optimizer (``_get_optimizer_overlap_cfgs``:
``data_parallel_size > 1``, src/megatron/bridge/training/comm_overlap.py@0685ff5) unless the
recipe sets them; the DeepSeek-V3 and Kimi-K2 H100 presets set ``cfg.comm_overlap.
overlap_grad_reduce = False`` ("Disabling to avoid functional errors", scripts/performance/configs/
deepseek/deepseek_llm_pretrain.py@69655bf and @0132842, kimi/kimi_llm_pretrain.py@a4fcff1), their
B200 / B300 / GB200 / GB300 presets True; GPT-OSS 120B's resolved configs run it on
(scripts/performance/dryrun_configs/gpt_oss/*.yaml@a9497c6: ``ddp.overlap_grad_reduce: true``),
and DeepSeek-V3 H100's off with ``overlap_param_gather`` still on (deepseek_v3_pretrain_h100_fp8_sc_v1.yaml@a9497c6).

A preset setting meshplan has no term for (``not_expressed``: Nemotron 3 Ultra's offload of the
expert MLP's FC1 output, ``offload_modules`` ``fused_group_mlp``) skips the row with that reason
(:class:`NotExpressible`) rather than estimating a run the preset did not make.

A row whose own value contradicts the preset keeps its value; every setting taken, kept or left
out is a line of ``Run.assumed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from meshplan.calib.recipes import (SOURCE_FRAMEWORK, BridgeRecipe, CommSettings, NotExpressible, RecipeKey,
                                    shipped_recipes)
from meshplan.plan import Offload, Recompute, RecomputeModule, even_split
from meshplan.spec.training import MoeDispatcher, Recipe

HYBRIDEP_NVLINK_EFFICIENCY = 1.0
"""HybridEP's dispatch and combine inside one NVLink domain: TMA copies that saturate NVLink with
4-16 SMs (NVIDIA Technical Blog, 'Optimizing Communication for Mixture-of-Experts Training with
Hybrid Expert Parallel', 2026-02-02, https://developer.nvidia.com/blog/optimizing-communication-for-
mixture-of-experts-training-with-hybrid-expert-parallel; DeepEP hybrid-ep docs: BF16 and FP8 paths,
TMA intra-node). -> Calibration.moe_dispatch_nvlink_efficiency."""


@dataclass(frozen=True, kw_only=True)
class Overlay:
    """What a row takes from its preset (None: the row's own value or its framework default)."""

    zero: int | None = None
    recompute: Recompute | None = None
    recompute_block_layers: int | None = None
    """Full recompute of this many layers per (virtual) stage (``block``); None: all."""
    recompute_modules: tuple[RecomputeModule, ...] = ()
    """Under selective recompute, the preset's modules (empty: the attention core alone)."""
    offload_layers: int | None = None
    """Activations of this many layers per pipeline rank in host memory; None: no offload."""
    calibration_values: tuple[tuple[str, Any], ...] = ()
    """Calibration fields the preset's expert all-to-all sets (module docstring), over the row's."""
    moe_dispatcher: MoeDispatcher | None = None
    """The training's token dispatcher the preset runs (module docstring); None: the default."""
    overlap_grad_reduce: bool | None = None
    """The training's ``overlap_grad_reduce`` the preset runs (module docstring); None: the default (on)."""
    fp8_recipe: Recipe | None = None
    """The fp8 recipe the preset was written for (:func:`preset_fp8_recipe`); None: not one."""
    notes: tuple[str, ...] = ()
    """One line per setting taken, kept or not expressible (for ``Run.assumed``)."""

    @property
    def applied(self) -> bool:
        return bool(self.calibration_values) or self.overlap_grad_reduce is False or any(
            v is not None for v in (self.zero, self.recompute, self.offload_layers, self.moe_dispatcher))

    def recompute_layers(self, num_layers: int, num_stages: int, stage_layers: tuple[int, ...]) -> tuple[int, ...]:
        """Layers recomputed per (virtual) stage: the first N of each (Megatron-Core's block method)."""
        if self.recompute_block_layers is None:
            return ()
        per_stage = stage_layers or even_split(num_layers, num_stages)
        return tuple(min(self.recompute_block_layers, n) for n in per_stage)

    @property
    def offload(self) -> tuple[Offload, ...]:
        return (Offload.ACTIVATIONS,) if self.offload_layers is not None else ()



def is_bridge_row(row: Mapping[str, str]) -> bool:
    return (row.get("source") or "").strip().startswith(SOURCE_FRAMEWORK)


PRESET_FP8_RECIPES = (("FP8_CS", Recipe.TENSORWISE), ("FP8_MX", Recipe.MXFP8))
"""The compute dtype a Megatron-Bridge workload config is named for (llama3_workload_base_configs.py
and the other scripts/performance/configs: ``<MODEL>_PRETRAIN_CONFIG_<GPU>_<DTYPE>_<VERSION>``,
the key its launcher looks up from ``--compute_dtype``): fp8_cs runs
bf16_with_fp8_current_scaling_mixed (tensorwise current scaling), fp8_mx bf16_with_mxfp8_mixed
(src/megatron/bridge/training/mixed_precision.py@0509780)."""


def preset_fp8_recipe(recipe: BridgeRecipe) -> Recipe | None:
    """The fp8 recipe of the preset's config name; None where it names none or both (a layout
    shared by the CS and MX configs, written 'CS/FP8_MX' in the table: the run's is not known)."""
    named = {r for tag, r in PRESET_FP8_RECIPES if tag in recipe.config}
    return named.pop() if len(named) == 1 else None


def overlay(recipe: BridgeRecipe, *, row_zero: int | None, row_recompute: str | None,
            comm: CommSettings | None = None) -> Overlay:
    """What a row takes from ``recipe``, given the row's own ZeRO stage and recompute (None:
    blank). A value the row gives wins; the notes say which setting went where. ``comm``: the
    expert all-to-all the row's release ran (calib/release_comm.py), in place of the file's.
    NotExpressible where the preset sets what meshplan cannot express."""
    if recipe.not_expressed:
        raise NotExpressible(f"{recipe.label} ({recipe.source}) sets {recipe.not_expressed}, which meshplan "
                             "cannot express: not estimated")
    notes: list[str] = []
    label = recipe.label
    zero = None
    if recipe.megatron_fsdp:
        if row_zero is None:
            zero = 3
            notes.append(f"zero: 3 ({label}: use_megatron_fsdp)")
        elif row_zero != 3:
            notes.append(f"zero: the row's {row_zero} kept ({label} says use_megatron_fsdp, zero 3)")

    # Megatron-Bridge's _set_recompute_overrides: recompute_num_layers sets full/block, then
    # recompute_modules (when given) sets selective, which wins.
    want, block, said = None, None, ""
    if recipe.recompute_num_layers is not None:
        want, block, said = Recompute.FULL, recipe.recompute_num_layers, f"recompute_num_layers={recipe.recompute_num_layers}"
    if recipe.recompute_modules:
        said = f"recompute_modules={'+'.join(recipe.recompute_modules)}"
        want, block = Recompute.SELECTIVE, None
    modules = tuple(RecomputeModule(m) for m in recipe.recompute_modules) if want == Recompute.SELECTIVE else ()
    recompute = None
    if want is not None:
        if row_recompute is None:
            recompute = want
            layers = f", the first {block} layers of each stage" if block is not None else ""
            notes.append(f"recompute: {want.value}{layers} ({label}: {said})")
        elif row_recompute != want.value:
            block, modules = None, ()
            notes.append(f"recompute: the row's {row_recompute} kept ({label} says {said})")
        else:
            block = None  # the row says so itself: every layer, as its recompute column reads
            if modules:  # a row's recompute column names no modules: they come from the preset
                recompute = want
                notes.append(f"recompute modules: {'+'.join(m.value for m in modules)} ({label}: {said})")

    offload_layers = recipe.cpu_offloading_num_layers
    if offload_layers is not None:
        notes.append(f"offload: activations of {offload_layers} layers per rank ({label}: "
                     f"cpu_offloading_num_layers={offload_layers})")
    values, comm_notes = alltoall_values(comm or recipe.comm)
    dispatcher, dispatcher_note = preset_dispatcher(comm or recipe.comm)
    fp8_recipe = preset_fp8_recipe(recipe)
    if fp8_recipe is not None:
        notes.append(f"fp8 recipe: {fp8_recipe.value} ({label})")
    if recipe.overlap_grad_reduce is False:
        notes.append(f"overlap_grad_reduce: off ({label}: comm_overlap.overlap_grad_reduce False, the "
                     "data-parallel gradient reduction runs after the backward, exposed)")
    return Overlay(fp8_recipe=fp8_recipe, overlap_grad_reduce=recipe.overlap_grad_reduce, zero=zero, recompute=recompute, recompute_block_layers=block if recompute else None,
                   recompute_modules=modules if recompute else (),
                   offload_layers=offload_layers, calibration_values=values, moe_dispatcher=dispatcher,
                   notes=(*notes, *comm_notes, *dispatcher_note))


def alltoall_values(recipe: BridgeRecipe | CommSettings) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The Calibration fields the preset's expert all-to-all sets, and a note per field (module
    docstring); nothing for what the file was not read for."""
    values: list[tuple[str, Any]] = []
    notes: list[str] = []
    if recipe.moe_a2a_overlap is False:
        values.append(("ep_overlap", 0.0))
        notes.append(f"ep_overlap: 0 ({recipe.label}: moe_a2a_overlap off, the expert all-to-all runs exposed)")
    if recipe.moe_flex_dispatcher_backend == "hybridep" and recipe.sync_free_dispatch:
        values.append(("moe_dispatch_nvlink_efficiency", HYBRIDEP_NVLINK_EFFICIENCY))
        notes.append(f"moe_dispatch_nvlink_efficiency: {HYBRIDEP_NVLINK_EFFICIENCY:g} ({recipe.label}: HybridEP's "
                     f"TMA dispatch saturates NVLink, in place of intra_node_comm_efficiency)")
    if recipe.moe_token_dispatcher_type == "flex" and not recipe.sync_free_dispatch:
        values.append(("moe_flex_host_sync", True))
        notes.append(f"moe_flex_host_sync: on ({recipe.label}: backend {recipe.moe_flex_dispatcher_backend}'s "
                     "dispatch waits on the host for the received token counts, once per MoE layer)")
    return tuple(values), tuple(notes)


def preset_dispatcher(recipe: BridgeRecipe | CommSettings) -> tuple[MoeDispatcher | None, tuple[str, ...]]:
    """The token dispatcher the preset runs, as meshplan costs it, and its note (module docstring);
    None where the file was not read for it or the default (alltoall) stands."""
    backend = recipe.moe_flex_dispatcher_backend
    if recipe.sync_free_dispatch:
        note = (f"moe dispatcher: flex ({recipe.label}: moe_token_dispatcher_type flex, backend {backend}: "
                "one send per picked rank, no host sync of the token counts)")
        return MoeDispatcher.FLEX, (note,)
    if recipe.moe_token_dispatcher_type == "flex":
        note = (f"moe dispatcher: flex ({recipe.label}: moe_token_dispatcher_type flex, backend {backend}: "
                "one send per picked rank, with a host sync of the token counts per MoE layer)")
        return MoeDispatcher.FLEX, (note,)
    return None, ()


PRESET_MODELS: Mapping[str, str] = MappingProxyType({"deepseek-v3-nomtp": "deepseek-v3"})
"""Model presets whose published rows ran another model's Megatron-Bridge preset: the 25.11
'DeepSeekV3 (w/o MTP)' rows ran the DeepSeek-V3 preset with its MTP block off (the row's name),
its memory settings otherwise as they are."""


def find_recipe(row: Mapping[str, str], key: RecipeKey,
                recipes: Mapping[RecipeKey, BridgeRecipe] | None = None) -> BridgeRecipe | None:
    """The preset a Megatron-Bridge row ran, or None (another source, or no preset of that key);
    the key's model read through :data:`PRESET_MODELS`."""
    if not is_bridge_row(row):
        return None
    key = (PRESET_MODELS.get(key[0], key[0]), *key[1:])
    return (shipped_recipes() if recipes is None else recipes).get(key)
