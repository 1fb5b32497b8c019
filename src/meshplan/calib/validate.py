"""Check the cost model against measured runs: a CSV in the format of runs_calibration.csv.

The rows are read and built into runs by ``calib/runs.py`` (cells: ``calib/run_cells.py``); this
module estimates them and the report (summary, signed errors) is ``calib/validation_report.py``.
Their names are re-exported here, the entry point the CLI, the fit and the benches import.

Throughput is compared on the quantity the row gives, in this order: TFLOP/s per GPU (on the
row's ``flops_basis``, with the formula the source used, see ``flops.reported_flops_per_token``),
MFU, tokens/s per GPU, step time. Memory is compared where measured. Rows whose notes say 'OOM'
are checked to be predicted as not fitting.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from meshplan.calib.run_cells import REQUIRED_COLUMNS, MalformedCell, read_rows
from meshplan.calib.runs import Run, Skipped, build_run, load_corrected_runs, load_runs, model_family, row_cluster
from meshplan.calib.validation_report import (
    GROUPINGS, OPTIMISTIC_MEMORY_ERROR, RowResult, ValidationReport,
)
from meshplan.cost.attention_kernels import kernel_fields
from meshplan.cost.calibration import Calibration, calibration_for, gpu_generation
from meshplan.cost.device_memory import MemoryBasis
from meshplan.cost.flops import reported_flops_per_token
from meshplan.cost.step import Estimate, estimate

__all__ = [
    "GROUPINGS", "OPTIMISTIC_MEMORY_ERROR", "REQUIRED_COLUMNS", "RUN_SETTINGS", "MalformedCell", "RowResult",
    "Run", "Skipped", "ValidationReport", "build_run", "evaluate", "load_corrected_runs", "load_runs",
    "memory_on_basis", "model_family", "predicted_metric", "read_rows", "row_cluster", "setting_calibration",
]


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
