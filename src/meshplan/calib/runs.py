"""A runs CSV row as the cost model's inputs: model, cluster, training and plan (``build_run``).

Each row becomes a model (a preset named through spec/presets/model_aliases.json, its dimensions
checked against the row's; or, for stacks whose runs were GPT models, GPT-style from the row's
dimensions: spec/row_model.py), a cluster (the row's ``system``, else the GPU preset's system, with
the row's GPUs per node),
a training setup and a plan (blank degrees = 1, blank dp = GPUs / (tp*pp*cp), blank micro-batch =
global batch / dp, ZeRO > 0 shards the data-parallel ranks). Blank precision, ZeRO stage, sequence
parallel and recompute take the defaults of the row's ``framework`` (spec/presets/frameworks.json),
listed per row in ``assumed``; a Megatron-Bridge row first takes the memory settings of the preset
it ran (Megatron FSDP, recompute, activation offload: ``calib/recipes.py``), listed there too.
Rows that cannot be built are returned with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from meshplan.calib.corrections import CorrectionReport, apply_corrections, shipped_corrections
from meshplan.calib.layouts import find_layout
from meshplan.calib.recipe_overlay import Overlay, find_recipe, is_bridge_row, overlay
from meshplan.calib.release_comm import comm_overlay, release_comm
from meshplan.calib.run_cells import MalformedCell, cell, read_rows, required_cell, whole_number
from meshplan.cost.calibration import DEFAULT_STACK
from meshplan.cost.device_memory import DEFAULT_MEMORY_BASIS, MemoryBasis, memory_basis
from meshplan.errors import MeshplanError
from meshplan.plan import (
    ParallelDims, Plan, Recompute, Schedule, data_parallel_degree, embedding_loss_split, format_counts, torchtitan_split,
    torchtitan_split_2024,
)
from meshplan.spec.aliases import resolve_alias
from meshplan.spec.cluster import ClusterSpec, cluster_for_gpu, system_preset
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.gpu_names import resolve_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.row_model import ROW_DIMENSIONS, row_model
from meshplan.spec.stack_version import release_dispatch, release_notes, release_of, release_values
from meshplan.spec.training import MoeDispatcher, Precision, TrainingSpec


@dataclass(frozen=True)
class Run:
    """One buildable row."""

    row_id: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    plan: Plan
    metric: str | None
    """'tflops_per_gpu', 'mfu', 'tokens_per_s_per_gpu', 'step_time_s' or None (no throughput)."""
    measured: float | None
    flops_basis: str
    measured_memory_gib: float | None
    oom: bool
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Calibration fields that describe the row's stack (its framework's defaults)."""
    assumed: tuple[str, ...] = ()
    """Every default the row took for a blank field (spec/frameworks.py)."""
    stack: str = DEFAULT_STACK
    """The calibration the row is estimated with: its framework's stack (frameworks.json)."""
    family: str = ""
    """The model family (``model_family``): the unit of leave-one-family-out."""
    preset: str = ""
    """The Megatron-Bridge preset whose memory settings the row took (``calib/recipes.py``); empty:
    none taken."""
    memory_basis: MemoryBasis = DEFAULT_MEMORY_BASIS
    """What ``measured_memory_gib`` counts (allocated, reserved, device total: the ``memory_basis``
    column, cost/device_memory.py); its error is taken against the prediction of the same figure."""
    release_values: Mapping[str, Any] = field(default_factory=dict)
    """Calibration fields the presets of the stack release the row ran set for it
    (``spec.stack_version``: 'Megatron-Bridge 26.06' MoE presets run full-iteration CUDA graphs)
    and those its own preset's expert all-to-all sets (``calib/recipe_overlay.py``: moe_a2a_overlap off,
    a sync-free dispatcher); applied over the row's calibration, per row (rows of one fit may run
    different releases and presets)."""


@dataclass(frozen=True)
class Skipped:
    row_id: str
    source: str
    reason: str


@dataclass(frozen=True)
class Skipped:
    row_id: str
    source: str
    reason: str


def build_run(row: dict[str, str]) -> Run:
    """Model, cluster, training and plan of one row; MeshplanError says why it cannot be built.
    Blank fields take the defaults of the row's framework (spec/frameworks.py), each listed in
    ``Run.assumed``."""
    fw = framework_defaults(row.get("framework"))
    S = required_cell(row, "seq_len")
    model, assumed = row_model(row.get("model"), {k: cell(row, k, whole_number) for k in ROW_DIMENSIONS}, S, fw)
    assumed = [fw.read_as, *assumed] if fw.read_as else list(assumed)
    gpus = required_cell(row, "num_gpus")
    gpn = cell(row, "gpus_per_node", whole_number, 8)
    gpu = (row.get("gpu") or "").strip()
    if not gpu:
        raise MeshplanError("gpu is blank")
    gpu_name = resolve_gpu(gpu)  # 'H100-SXM5-80GB', 'NVIDIA A100 80GB', ... -> a preset
    assumed.extend([gpu_name.note] if gpu_name.note else [])
    cluster = row_cluster((row.get("system") or "").strip(), gpu_name.preset, gpn).with_gpus(gpus)

    def default(key: str, value: Any, cast: Callable[[str], Any] = str) -> Any:
        if (row.get(key) or "").strip():
            return cell(row, key, cast) if cast is not str else row[key].strip()
        assumed.append(f"{key}: {value} ({fw.name} default)")
        return value

    precision = Precision(default("precision", fw.precision.value))
    gbs = required_cell(row, "global_batch_size")
    tp, pp, cp = (cell(row, k, whole_number, 1) for k in ("tp", "pp", "cp"))
    ep, vpp = cell(row, "ep", whole_number, 1), cell(row, "vpp", whole_number, 1)
    dp = cell(row, "dp", whole_number, 0) or data_parallel_degree(gpus, tp=tp, pp=pp, cp=cp)
    if tp * pp * cp * dp != gpus:
        raise MeshplanError(f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} is not the GPU count {gpus} "
                            "(degrees not given in the source?)")
    mb = cell(row, "micro_batch_size", whole_number, 0) or max(1, gbs // dp)
    # The preset a Megatron-Bridge row ran: its memory settings where the row is blank (recipes.py)
    preset = find_recipe(row, (model.name, gpu_name.preset, precision.value, gpus, gbs, mb, tp, pp, cp, vpp, ep))
    release = release_of(fw.stack, row.get("framework"), row.get("source"))
    family = model_family(model.name, fw.architecture)
    # bridge_recipes.csv is read at one commit: the expert all-to-all a row's own release ran,
    # where stack_releases.json dates another (Megatron-Bridge rows: they ran its presets)
    dispatch = release_dispatch(fw.stack, release, family=family, gpu=gpu_name.preset, model=model.name,
                                precision=precision.value, moe=model.is_moe) if is_bridge_row(row) else {}
    comm = release_comm(dispatch, preset.comm if preset is not None else None,
                        f"Megatron-Bridge {release} presets, spec/presets/stack_releases.json") if dispatch else None
    if preset is not None:
        extra = overlay(preset, row_zero=cell(row, "zero", whole_number),
                        row_recompute=(row.get("recompute") or "").strip() or None, comm=comm)
    else:
        extra = comm_overlay(comm) if comm is not None else Overlay()
    if comm is not None:
        assumed.append(f"moe all-to-all: {comm.moe_token_dispatcher_type or 'the default dispatcher'}"
                       f"{' ' + comm.moe_flex_dispatcher_backend if comm.moe_flex_dispatcher_backend else ''}, "
                       f"moe_a2a_overlap {comm.moe_a2a_overlap} ({comm.label}, over the preset file's)")
    assumed += extra.notes
    recipe = None  # fp4: NVFP4
    if precision == Precision.FP8:  # the preset's recipe, else the framework's on this GPU
        recipe = extra.fp8_recipe or fw.fp8_recipe(cluster.gpu)
        if extra.fp8_recipe is None:
            assumed.append(f"fp8 recipe: {recipe.value} ({fw.name} default on {cluster.gpu.name})")
    zero = extra.zero if extra.zero is not None else default("zero", fw.zero, whole_number)
    recompute = extra.recompute or Recompute(default("recompute", fw.recompute))
    sp = default("sequence_parallel", int(fw.sequence_parallel_with_tp and tp > 1), whole_number)
    stage_layers: tuple[int, ...] = ()
    mtp_stage = None
    # The layout a Megatron-Bridge recipe runs for this model and (pp, vpp) (calib/layouts.py)
    layout = find_layout(row, (model.name, pp, vpp)) if pp > 1 else None
    if layout is not None and layout.layout.mtp_layers in (0, model.mtp_num_layers):
        stage_layers, mtp_stage = layout.layout.stage_layers, layout.layout.mtp_stage
        assumed.append(layout.note)
    elif fw.embedding_loss_stages and (pp * vpp > model.num_layers or (
            fw.stack == "megatron" and model.num_layers % (pp * vpp)
            and (model.num_layers + 2) % (pp * vpp) == 0)):
        # Megatron-Core refuses virtual stages of unequal size unless the split is asymmetric
        # (Megatron-Bridge GPTModelProvider.provide's assert): layers that do not split evenly
        # over the virtual stages but do with the embedding and the loss as one layer each ran
        # that split (the Llama 3.1 405B recipe sets account_for_embedding_in_pipeline_split).
        stage_layers = embedding_loss_split(model.num_layers, pp * vpp)
        assumed.append(f"pipeline split: embedding and loss count as a layer each ({fw.name} default)")
    elif pp > 1 and fw.pipeline_split != "even" and pp * vpp <= model.num_layers:
        # a run that names no split ran its stack's own (torchtitan's generate_split_points), not
        # meshplan's even split (frameworks.json pipeline_split)
        split = torchtitan_split_2024 if fw.pipeline_split == "torchtitan-2024" else torchtitan_split
        stage_layers = split(model.num_layers, pp * vpp)
        assumed.append(f"pipeline split: {format_counts(stage_layers)} ({fw.name} default)")
    etp = 0
    if model.is_moe and fw.expert_tensor_parallel is not None and fw.expert_tensor_parallel != tp:
        etp = fw.expert_tensor_parallel
        assumed.append(f"expert tensor parallel: {etp} ({fw.name} default)")
    plan = Plan(
        dims=ParallelDims(dp_replicate=1 if zero else dp, dp_shard=dp if zero else 1, tp=tp, pp=pp,
                          cp=cp, ep=ep, etp=etp),
        zero=zero, sp=bool(sp) and tp > 1,
        schedule=Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B, vpp=vpp,
        stage_layers=stage_layers, mtp_stage=mtp_stage, micro_batch=mb, recompute=recompute,
        recompute_layers=extra.recompute_layers(model.num_layers, pp * vpp, stage_layers),
        recompute_modules=extra.recompute_modules if recompute == Recompute.SELECTIVE else (),
        offload=extra.offload, offload_layers=extra.offload_layers or 0,
    )
    alias = resolve_alias(row.get("model") or "")  # a token-drop run's capacity (spec/aliases.py)
    training = TrainingSpec(seq_len=S, global_batch=gbs, precision=precision, recipe=recipe,
                            moe_dispatcher=extra.moe_dispatcher or MoeDispatcher.ALLTOALL,
                            overlap_grad_reduce=extra.overlap_grad_reduce is not False,
                            moe_capacity_factor=alias.moe_capacity_factor if alias is not None else None)
    plan.validate_for(model, training, cluster.num_gpus)
    release_vals = release_values(fw.stack, release, family=family, gpu=gpu_name.preset, model=model.name,
                                  precision=precision.value, moe=model.is_moe)
    # the preset's expert all-to-all (calib/recipe_overlay.py): more specific than its release's presets
    release_vals.update(extra.calibration_values)
    note = release_notes(fw.stack, release, release_vals)
    assumed += [note] if note else []
    metric, measured = None, None
    # tokens/s first where a row gives it: it needs no FLOP count, whose formula differs by
    # source (Megatron-Bridge's halves causal attention, Narayanan et al. 2021's does not)
    for key, name in (("measured_tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
                      ("measured_tflops_per_gpu", "tflops_per_gpu"), ("measured_mfu", "mfu"),
                      ("measured_step_time_s", "step_time_s")):
        v = cell(row, key, float)
        if v is not None and v > 0:
            metric, measured = name, v
            break
    basis = (row.get("flops_basis") or "model").strip() or "model"
    memory_gib = cell(row, "measured_peak_mem_gib", float)
    if memory_gib is not None and memory_gib <= 0:  # the memory error divides by it
        raise MalformedCell(f"column measured_peak_mem_gib: {memory_gib:g} is not a memory (> 0 GiB)")
    try:
        mem_basis = memory_basis(row.get("memory_basis"))
    except MeshplanError as exc:
        raise MalformedCell(f"column memory_basis: {exc}") from None
    if memory_gib is not None and not (row.get("memory_basis") or "").strip():
        assumed.append(f"memory_basis: {mem_basis.value} (blank)")
    return Run(row_id=row.get("id", ""), source=row.get("source", ""), model=model, cluster=cluster,
               training=training, plan=plan, metric=metric, measured=measured, flops_basis=basis,
               measured_memory_gib=memory_gib, memory_basis=mem_basis,
               oom="OOM" in (row.get("notes") or ""), settings=MappingProxyType(fw.settings),
               assumed=tuple(assumed), stack=fw.stack, family=family,
               preset=preset.config if preset is not None and extra.applied else "",
               release_values=MappingProxyType(release_vals))


def row_cluster(system: str, gpu: str, gpus_per_node: int) -> ClusterSpec:
    """The row's nodes: its ``system`` column (a system preset: the machine the run used, its NICs
    and NVLink), else the first system preset with the row's GPU (``cluster_for_gpu``)."""
    if not system:
        return cluster_for_gpu(gpu, gpus_per_node=gpus_per_node)
    cluster = system_preset(system).with_size(gpus_per_node=gpus_per_node)
    if cluster.gpu.name != gpu:
        raise MalformedCell(f"column system: {system!r} holds {cluster.gpu.name}, the row's gpu is {gpu}")
    return cluster


def model_family(name: str, architecture: str | None) -> str:
    """The family of a model: the leading letters of its name ('llama3.1-405b' -> 'llama',
    'BLOOM-176B' -> 'bloom', 'qwen3-30b-a3b' -> 'qwen'); a name without (a row given only by its
    dimensions, '175B (GPT-3)') is of its framework's architecture ('gpt')."""
    m = re.match(r"[a-z]+", name.strip().lower())
    return m.group() if m else (architecture or "unnamed")


def load_runs(path: str | Path, *, as_published: bool = False) -> tuple[list[Run], list[Skipped]]:
    """The runs of a CSV, with the documented corrections that match its rows applied (unless
    ``as_published``: the file as given)."""
    runs, skipped, _ = load_corrected_runs(path, as_published=as_published)
    return runs, skipped


def load_corrected_runs(path: str | Path, *, as_published: bool = False
                        ) -> tuple[list[Run], list[Skipped], CorrectionReport]:
    """load_runs, and which documented corrections (data/corrections.csv) it applied."""
    rows = read_rows(path)
    if as_published:
        report = CorrectionReport(as_published=True)
    else:
        rows, report = apply_corrections(rows, shipped_corrections())
    runs, skipped = [], []
    for n, row in enumerate(rows, start=1):
        try:
            runs.append(build_run(row))
        except MalformedCell as exc:
            raise MeshplanError(f"{path}: data row {n} (id {row.get('id', '?')}): {exc}") from None
        except (MeshplanError, ValueError) as exc:
            skipped.append(Skipped(row_id=row.get("id", ""), source=row.get("source", ""), reason=str(exc)))
    return runs, skipped, report
