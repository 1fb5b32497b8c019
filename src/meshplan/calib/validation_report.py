"""The result of validating runs: one ``RowResult`` per row, and the summary and signed-error
tables ``meshplan validate`` prints (median and p90 absolute error, bias per precision, dense/MoE,
GPU, generation and family: issue 14 item 7)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from meshplan.calib.runs import Skipped
from meshplan.cost.calibration import DEFAULT_STACK
from meshplan.cost.device_memory import DEFAULT_MEMORY_BASIS


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
    flags: tuple[str, ...] = ()
    """Marks on the row that leave its error in the figures (calib/release_twins.py: a twin in
    another release contradicts it)."""


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
            "flagged_rows": sum(bool(r.flags) for r in self.rows),
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
