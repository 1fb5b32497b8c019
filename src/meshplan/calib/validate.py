"""Check the cost model against measured runs: a CSV in the format of runs_calibration.csv.

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

Throughput is compared on the quantity the row gives, in this order: TFLOP/s per GPU (on the
row's ``flops_basis``, with the formula the source used, see ``flops.reported_flops_per_token``),
MFU, tokens/s per GPU, step time. Memory is compared where measured. Rows whose notes say 'OOM'
are checked to be predicted as not fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

import re
from collections import Counter

from meshplan.calib.corrections import CorrectionReport, apply_corrections, shipped_corrections
from meshplan.calib.layouts import find_layout
from meshplan.calib.recipes import Overlay, find_recipe, overlay
from meshplan.cost.attention_kernels import kernel_fields
from meshplan.cost.calibration import DEFAULT_STACK, Calibration, calibration_for, gpu_generation
from meshplan.cost.device_memory import DEFAULT_MEMORY_BASIS, MemoryBasis, memory_basis
from meshplan.cost.flops import reported_flops_per_token
from meshplan.cost.step import Estimate, estimate
from meshplan.errors import MeshplanError
from meshplan.numbers import MAX_COUNT
from meshplan.plan import ParallelDims, Plan, Recompute, Schedule, data_parallel_degree, embedding_loss_split
from meshplan.spec.cluster import ClusterSpec, cluster_for_gpu, system_preset
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.stack_version import release_notes, release_of, release_values
from meshplan.spec.gpu_names import resolve_gpu
from meshplan.spec.model import ModelSpec
from meshplan.spec.aliases import resolve_alias
from meshplan.spec.row_model import ROW_DIMENSIONS, row_model
from meshplan.spec.training import MoeDispatcher, Precision, TrainingSpec
from meshplan.textfile import csv_records, read_text_file

REQUIRED_COLUMNS = (
    "id", "source", "model", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
    "ffn_hidden_size", "vocab_size", "seq_len", "gpu", "num_gpus", "gpus_per_node",
    "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "ep", "vpp", "zero",
    "sequence_parallel", "recompute", "precision", "measured_tflops_per_gpu", "flops_basis",
    "measured_mfu", "measured_tokens_per_s_per_gpu", "measured_step_time_s",
    "measured_peak_mem_gib", "notes",
)


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
    and those its own preset's expert all-to-all sets (``calib/recipes.py``: moe_a2a_overlap off,
    a sync-free dispatcher); applied over the row's calibration, per row (rows of one fit may run
    different releases and presets)."""


@dataclass(frozen=True)
class Skipped:
    row_id: str
    source: str
    reason: str


@dataclass(frozen=True)
class RowResult:
    row_id: str
    source: str
    model: str
    plan: str
    gpu: str
    metric: str | None
    measured: float | None
    predicted: float | None
    error: float | None
    """predicted / measured - 1 on the row's metric."""
    measured_memory_gib: float | None
    predicted_memory_gib: float
    """The prediction on the row's ``memory_basis``."""
    memory_error: float | None
    fits: bool
    oom: bool
    assumed: tuple[str, ...] = ()
    stack: str = DEFAULT_STACK
    family: str = ""
    generation: str = ""
    precision: str = ""
    moe: bool = False
    preset: str = ""
    memory_basis: str = DEFAULT_MEMORY_BASIS.value
    predicted_step_s: float | None = None
    """The model's step time (calib/pairwise.py compares two layouts of a job on it)."""


OPTIMISTIC_MEMORY_ERROR = 0.05
"""A memory prediction this far below the measurement is optimistic: issue 14's target ("never
more than 5% optimistic for a run that fit")."""

GROUPINGS: Mapping[str, Callable[[RowResult], str]] = MappingProxyType({
    "precision": lambda r: r.precision,
    "dense_moe": lambda r: "moe" if r.moe else "dense",
    "gpu": lambda r: r.gpu,
    "generation": lambda r: r.generation,
    "family": lambda r: r.family,
})
"""How the signed errors are broken down (bias shows there, issue 14 item 7)."""


@dataclass(frozen=True)
class ValidationReport:
    rows: tuple[RowResult, ...]
    skipped: tuple[Skipped, ...]

    def _abs(self, attr: str, rows=None) -> np.ndarray:
        return np.array([abs(getattr(r, attr)) for r in (rows or self.rows) if getattr(r, attr) is not None])

    @property
    def throughput_median_abs_error(self) -> float:
        return _pct(self._abs("error"), 50)

    @property
    def throughput_p90_abs_error(self) -> float:
        return _pct(self._abs("error"), 90)

    @property
    def memory_median_abs_error(self) -> float:
        return _pct(self._abs("memory_error"), 50)

    @property
    def memory_p90_abs_error(self) -> float:
        return _pct(self._abs("memory_error"), 90)

    @property
    def memory_optimistic_rows(self) -> int:
        """Rows whose predicted peak memory is more than ``OPTIMISTIC_MEMORY_ERROR`` below the
        measured one (issue 14: never, for a run that fit)."""
        return sum(r.memory_error is not None and r.memory_error < -OPTIMISTIC_MEMORY_ERROR for r in self.rows)

    @property
    def oom_rows(self) -> int:
        return sum(r.oom for r in self.rows)

    @property
    def oom_predicted(self) -> int:
        return sum(r.oom and not r.fits for r in self.rows)

    def signed_by(self, key: Callable[[RowResult], str]) -> dict[str, dict[str, float]]:
        """Rows, median signed and median absolute throughput error per group."""
        groups: dict[str, list[float]] = {}
        for r in self.rows:
            if r.error is not None:
                groups.setdefault(key(r), []).append(r.error)
        return {g: {"rows": len(e), "median_signed_error": float(np.median(e)),
                    "median_abs_error": float(np.median(np.abs(e)))} for g, e in sorted(groups.items())}

    def breakdown(self) -> dict[str, dict[str, dict[str, float]]]:
        return {name: self.signed_by(key) for name, key in GROUPINGS.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows), "skipped": len(self.skipped),
            "throughput_rows": int(self._abs("error").size),
            "throughput_median_abs_error": self.throughput_median_abs_error,
            "throughput_p90_abs_error": self.throughput_p90_abs_error,
            "throughput_median_signed_error": _pct(np.array([r.error for r in self.rows if r.error is not None]), 50),
            "memory_rows": int(self._abs("memory_error").size),
            "memory_median_abs_error": self.memory_median_abs_error,
            "memory_p90_abs_error": self.memory_p90_abs_error,
            "memory_optimistic_rows": self.memory_optimistic_rows,
            "memory_rows_by_basis": dict(sorted(Counter(r.memory_basis for r in self.rows
                                                        if r.memory_error is not None).items())),
            "oom_rows": self.oom_rows, "oom_predicted_not_fitting": self.oom_predicted,
            "preset_rows": sum(bool(r.preset) for r in self.rows),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "signed_error_by": self.breakdown(),
            "rows": [r.__dict__ for r in self.rows],
            "skipped": [s.__dict__ for s in self.skipped],
        }


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


# ---- reading -------------------------------------------------------------------------------
def read_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    text = read_text_file(p, what="runs CSV", missing="no such runs file")
    return [dict(r) for r in csv_records(text, str(p), required=REQUIRED_COLUMNS, what="runs CSV")]


class MalformedCell(MeshplanError):
    """A numeric column holding text, nan or inf: the file is wrong, not the run (load_runs
    refuses the file instead of skipping the row)."""


def _num(row: dict[str, str], key: str, cast: Callable[[str], Any], default: Any = None) -> Any:
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is None:
            return None
        return default
    try:
        value = cast(raw)
    except MalformedCell as exc:
        raise MalformedCell(f"column {key}: {exc}") from None
    except (ValueError, OverflowError):
        raise MalformedCell(f"column {key}: {raw!r} is not a {'number' if cast is float else 'whole number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise MalformedCell(f"column {key}: {raw!r} is not finite")
    return value


def _int(raw: str) -> int:
    f = float(raw)
    if not math.isfinite(f) or f != int(f):
        raise ValueError(raw)
    if abs(f) > MAX_COUNT:
        raise MalformedCell(f"{raw!r} is too large (at most {MAX_COUNT:,})")
    return int(f)


def _need(row: dict[str, str], key: str, cast=_int) -> Any:
    v = _num(row, key, cast)
    if v is None:
        raise MeshplanError(f"{key} is blank")
    return v


def build_run(row: dict[str, str]) -> Run:
    """Model, cluster, training and plan of one row; MeshplanError says why it cannot be built.
    Blank fields take the defaults of the row's framework (spec/frameworks.py), each listed in
    ``Run.assumed``."""
    fw = framework_defaults(row.get("framework"))
    S = _need(row, "seq_len")
    model, assumed = row_model(row.get("model"), {k: _num(row, k, _int) for k in ROW_DIMENSIONS}, S, fw)
    assumed = [fw.read_as, *assumed] if fw.read_as else list(assumed)
    gpus = _need(row, "num_gpus")
    gpn = _num(row, "gpus_per_node", _int, 8)
    gpu = (row.get("gpu") or "").strip()
    if not gpu:
        raise MeshplanError("gpu is blank")
    gpu_name = resolve_gpu(gpu)  # 'H100-SXM5-80GB', 'NVIDIA A100 80GB', ... -> a preset
    assumed.extend([gpu_name.note] if gpu_name.note else [])
    cluster = row_cluster((row.get("system") or "").strip(), gpu_name.preset, gpn).with_gpus(gpus)

    def default(key: str, value: Any, cast: Callable[[str], Any] = str) -> Any:
        if (row.get(key) or "").strip():
            return _num(row, key, cast) if cast is not str else row[key].strip()
        assumed.append(f"{key}: {value} ({fw.name} default)")
        return value

    precision = Precision(default("precision", fw.precision.value))
    gbs = _need(row, "global_batch_size")
    tp, pp, cp = (_num(row, k, _int, 1) for k in ("tp", "pp", "cp"))
    ep, vpp = _num(row, "ep", _int, 1), _num(row, "vpp", _int, 1)
    dp = _num(row, "dp", _int, 0) or data_parallel_degree(gpus, tp=tp, pp=pp, cp=cp)
    if tp * pp * cp * dp != gpus:
        raise MeshplanError(f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} is not the GPU count {gpus} "
                            "(degrees not given in the source?)")
    mb = _num(row, "micro_batch_size", _int, 0) or max(1, gbs // dp)
    # The preset a Megatron-Bridge row ran: its memory settings where the row is blank (recipes.py)
    preset = find_recipe(row, (model.name, gpu_name.preset, precision.value, gpus, gbs, mb, tp, pp, cp, vpp, ep))
    extra = Overlay() if preset is None else overlay(
        preset, row_zero=_num(row, "zero", _int), row_recompute=(row.get("recompute") or "").strip() or None)
    assumed += extra.notes
    recipe = None  # fp4: NVFP4
    if precision == Precision.FP8:  # the preset's recipe, else the framework's on this GPU
        recipe = extra.fp8_recipe or fw.fp8_recipe(cluster.gpu)
        if extra.fp8_recipe is None:
            assumed.append(f"fp8 recipe: {recipe.value} ({fw.name} default on {cluster.gpu.name})")
    zero = extra.zero if extra.zero is not None else default("zero", fw.zero, _int)
    recompute = extra.recompute or Recompute(default("recompute", fw.recompute))
    sp = default("sequence_parallel", int(fw.sequence_parallel_with_tp and tp > 1), _int)
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
    release = release_of(fw.stack, row.get("framework"), row.get("source"))
    family = model_family(model.name, fw.architecture)
    release_vals = release_values(fw.stack, release, family=family, gpu=gpu_name.preset, model=model.name,
                                  precision=precision.value, moe=model.is_moe)
    # the preset's expert all-to-all (calib/recipes.py): more specific than its release's presets
    release_vals.update(extra.calibration_values)
    note = release_notes(fw.stack, release, release_vals)
    assumed += [note] if note else []
    metric, measured = None, None
    # tokens/s first where a row gives it: it needs no FLOP count, whose formula differs by
    # source (Megatron-Bridge's halves causal attention, Narayanan et al. 2021's does not)
    for key, name in (("measured_tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
                      ("measured_tflops_per_gpu", "tflops_per_gpu"), ("measured_mfu", "mfu"),
                      ("measured_step_time_s", "step_time_s")):
        v = _num(row, key, float)
        if v is not None and v > 0:
            metric, measured = name, v
            break
    basis = (row.get("flops_basis") or "model").strip() or "model"
    memory_gib = _num(row, "measured_peak_mem_gib", float)
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


# ---- predicting ----------------------------------------------------------------------------
def predicted_metric(run: Run, step_time_s: float) -> float | None:
    """The row's throughput metric for a predicted step time."""
    tr = run.training
    gpus = run.cluster.num_gpus
    if run.metric in ("tflops_per_gpu", "mfu"):
        basis = run.flops_basis if run.metric == "tflops_per_gpu" else "model"
        flops = reported_flops_per_token(run.model, tr.seq_len, run.plan.recompute.value, basis)
        per_gpu = flops * tr.tokens_per_step / step_time_s / gpus
        if run.metric == "mfu":
            return per_gpu / run.cluster.gpu.peak_flops(tr.precision)
        return per_gpu / 1e12
    if run.metric == "tokens_per_s_per_gpu":
        return tr.tokens_per_step / step_time_s / gpus
    if run.metric == "step_time_s":
        return step_time_s
    return None


def setting_calibration(run: Run, base: Calibration | None, settings: Mapping[str, Any],
                        stack: str | None = None) -> Calibration:
    calib = base or calibration_for(run.cluster.gpu, stack or run.stack)
    kernel = settings.get("attention_kernel")
    if kernel is not None and kernel != calib.attention_kernel:  # a framework's own kernel: its rate on this GPU
        settings = {**kernel_fields(gpu_generation(run.cluster.gpu), kernel), **settings}
    return calib.replace_fields(**settings) if settings else calib


def memory_on_basis(est: Estimate, basis: MemoryBasis) -> float:
    """The estimate's peak memory (GiB) on a measurement's basis (cost/device_memory.py)."""
    return {MemoryBasis.ALLOCATED: est.peak_allocated_gib, MemoryBasis.RESERVED: est.peak_memory_gib,
            MemoryBasis.DEVICE: est.peak_device_gib}[basis]


def evaluate(runs: list[Run], skipped: list[Skipped], *, settings: Mapping[str, Any] | None = None,
             calib_for: Callable[[Run], Calibration] | None = None,
             stack: str | None = None) -> ValidationReport:
    """Estimate every run. ``settings`` are calibration fields describing the runs' software
    (e.g. fused_attention=False), over each run's own (its framework's); ``calib_for`` replaces
    the per-(generation, stack) calibration (fitting); ``stack`` replaces each row's stack."""
    settings = settings or {}
    out = []
    for run in runs:
        base = calib_for(run) if calib_for else None
        calib = setting_calibration(run, base, {**run.settings, **run.release_values, **settings}, stack)
        est = estimate(run.model, run.cluster, run.training, run.plan, calib)
        pred = predicted_metric(run, est.step_time_s)
        err = None if pred is None or run.measured is None else pred / run.measured - 1.0
        pred_mem = memory_on_basis(est, run.memory_basis)
        mem_err = None if run.measured_memory_gib is None else pred_mem / run.measured_memory_gib - 1.0
        out.append(RowResult(
            row_id=run.row_id, source=run.source, model=run.model.name, plan=run.plan.notation(),
            gpu=run.cluster.gpu.name, metric=run.metric, measured=run.measured, predicted=pred,
            error=err, measured_memory_gib=run.measured_memory_gib,
            predicted_memory_gib=pred_mem, memory_error=mem_err, fits=est.fits, oom=run.oom,
            assumed=run.assumed, stack=stack or run.stack, family=run.family,
            generation=gpu_generation(run.cluster.gpu), precision=run.training.precision.value,
            moe=run.model.is_moe, preset=run.preset, memory_basis=run.memory_basis.value,
            predicted_step_s=est.step_time_s))
    return ValidationReport(rows=tuple(out), skipped=tuple(skipped))


RUN_SETTINGS: Mapping[str, Any] = MappingProxyType({"fused_attention": False, "dropout": True})
"""What the runs in runs_calibration.csv used (Megatron-LM / Megatron-DeepSpeed 2020-2022):
no FlashAttention (scaled-masked-softmax kernels on materialised scores) and dropout 0.1."""
