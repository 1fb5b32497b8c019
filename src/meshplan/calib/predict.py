"""Predicted versus measured for one training run (pure Python: no torch, the bench uses it too).

``predict(job, profile)`` is the planner's estimate for the Job on the machine it runs on: the
cluster's rates and the cost model's factors come from ``hardware.resolve_hardware`` (a hardware
profile from ``meshplan profile`` when one is given, as in every other command), and the memory
is put on the basis the runtime can measure:

* CPU: peak resident memory of the process (ru_maxrss). The profile's framework baseline (a
  torch worker's RSS) is the cost model's framework overhead; the runtime trains in fp32 on CPU,
  so weights and gradients are 4-byte with no master copy, activations are 4-byte (the cost
  model sizes them from the training precision, ``cost.layer.activation_bytes``), and there is
  no caching allocator to fragment.
* GPU: torch.cuda.max_memory_allocated, which excludes the CUDA context: the estimate less the
  calibration's framework overhead (reserved memory is reported beside it).

``compare(prediction, step_times_s, peak_memory_gib)`` takes the median step time after warm-up.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any, Sequence

from meshplan.calib.hardware import CPU_DEVICE, device_type, resolve_hardware
from meshplan.cost import Estimate, estimate
from meshplan.plan import Job
from meshplan.spec.cluster import GIB
from meshplan.spec.training import Precision


@dataclass(frozen=True, kw_only=True)
class Prediction:
    step_time_s: float
    peak_memory_gib: float
    memory_basis: str
    calibration_source: str
    estimate: Estimate


@dataclass(frozen=True, kw_only=True)
class PredictedVsMeasured:
    predicted_step_time_s: float
    measured_step_time_s: float
    predicted_peak_memory_gib: float
    measured_peak_memory_gib: float
    memory_basis: str
    measured_steps: int
    """Steps in the median (after warm-up)."""
    calibration_source: str
    measured_reserved_gib: float | None = None

    @property
    def step_time_error(self) -> float:
        """(predicted - measured) / measured: positive means the planner was pessimistic."""
        return (self.predicted_step_time_s - self.measured_step_time_s) / self.measured_step_time_s

    @property
    def peak_memory_error(self) -> float:
        return (self.predicted_peak_memory_gib - self.measured_peak_memory_gib) / self.measured_peak_memory_gib

    def to_dict(self) -> dict[str, Any]:
        """The fields ``meshplan train`` adds to its JSONL summary."""
        return {
            "predicted_step_time_s": self.predicted_step_time_s,
            "measured_step_time_s": self.measured_step_time_s,
            "step_time_error": self.step_time_error,
            "predicted_peak_memory_gib": self.predicted_peak_memory_gib,
            "measured_peak_memory_gib": self.measured_peak_memory_gib,
            "peak_memory_error": self.peak_memory_error,
            "measured_reserved_gib": self.measured_reserved_gib,
            "memory_basis": self.memory_basis,
            "measured_steps": self.measured_steps,
            "calibration_source": self.calibration_source,
        }


def predict(job: Job, profile_path: str | None = None, device: str | None = None) -> Prediction:
    """The estimate for this Job on this machine, on the memory basis ``device`` measures
    (default: where the runtime runs the Job's cluster, ``hardware.device_type``)."""
    device = device or device_type(job.cluster)
    training = job.training
    if device == CPU_DEVICE:  # the runtime autocasts on CUDA only: CPU ranks compute in fp32
        training = replace(training, precision=Precision.FP32, recipe=None)
    hw = resolve_hardware(job.cluster, training.precision, profile_path)
    est = estimate(job.model, hw.cluster, training, job.plan, hw.calib)
    peak_bytes = est.memory.total_bytes
    if device == CPU_DEVICE:
        basis = "process resident peak (ru_maxrss), max over ranks"
    else:
        peak_bytes -= hw.calib.framework_overhead_gib * GIB  # the CUDA context is not allocated memory
        basis = "torch.cuda.max_memory_allocated, max over ranks"
    return Prediction(step_time_s=est.step_time_s, peak_memory_gib=peak_bytes / GIB, memory_basis=basis,
                      calibration_source=hw.calib.source, estimate=est)


def warmup_steps(num_steps: int) -> int:
    """Steps left out of the median: the first builds lazily (optimizer states, allocator, caches)."""
    return min(2, max(0, num_steps - 1))


def compare(pred: Prediction, step_times_s: Sequence[float], peak_memory_gib: float,
            reserved_gib: float | None = None) -> PredictedVsMeasured:
    if not step_times_s:
        raise ValueError("no measured steps to compare with")
    kept = list(step_times_s)[warmup_steps(len(step_times_s)):]
    return PredictedVsMeasured(
        predicted_step_time_s=pred.step_time_s, measured_step_time_s=statistics.median(kept),
        predicted_peak_memory_gib=pred.peak_memory_gib, measured_peak_memory_gib=peak_memory_gib,
        memory_basis=pred.memory_basis, measured_steps=len(kept),
        calibration_source=pred.calibration_source, measured_reserved_gib=reserved_gib,
    )


def comparison_table(cmp: PredictedVsMeasured):
    """A rich Table: predicted, measured and error for step time and peak memory."""
    from rich.table import Table

    t = Table(title="Predicted vs measured")
    for col in ("", "predicted", "measured", "error"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row("step time (s)", f"{cmp.predicted_step_time_s:.4f}",
              f"{cmp.measured_step_time_s:.4f} (median of {cmp.measured_steps})", f"{cmp.step_time_error:+.1%}")
    t.add_row("peak memory (GiB)", f"{cmp.predicted_peak_memory_gib:.3f}", f"{cmp.measured_peak_memory_gib:.3f}",
              f"{cmp.peak_memory_error:+.1%}")
    if cmp.measured_reserved_gib is not None:
        t.add_row("reserved memory (GiB)", "", f"{cmp.measured_reserved_gib:.3f}", "")
    t.caption = f"memory: {cmp.memory_basis}; calibration: {cmp.calibration_source.split(' (')[0]}"
    return t


def attach_prediction(job: Job, log_path: str | Path, profile_path: str | None = None) -> PredictedVsMeasured:
    """Compare the run logged at ``log_path`` (``meshplan train``'s JSON lines) with the
    prediction, and add the comparison's fields to the log's summary line (rewritten in place)."""
    path = Path(log_path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if not r.get("summary") and "step_time_s" in r]
    if not steps:
        raise ValueError(f"{path}: no step records to compare with")
    pred = predict(job, profile_path)
    reserved = [r["peak_reserved_gib"] for r in steps if r.get("peak_reserved_gib") is not None]
    cmp = compare(pred, [r["step_time_s"] for r in steps], max(r["peak_memory_gib"] for r in steps),
                  max(reserved) if reserved else None)
    for r in records:
        if r.get("summary"):
            r.update(cmp.to_dict())
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return cmp
