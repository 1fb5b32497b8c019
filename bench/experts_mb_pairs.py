"""What the measured pairs of layouts differing in the micro-batch say about a gain that comes from a
larger micro-batch (bench_experts' verdicts, experts_evidence.py): per GPU generation, how much more
the model credits the larger micro-batch than the measurements do (calib/pairwise.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache

from meshplan.calib.fit import calibration_key
from meshplan.calib.pairwise import MEASURED_TIE, pairs
from meshplan.calib.validate import Run, evaluate, load_runs
from meshplan.data.published import PUBLISHED_RUNS, runs_csv


def _generation(run: Run) -> str:
    return calibration_key(run).split("/")[0]


@dataclass(frozen=True)
class MicroBatchPair:
    """Two measured layouts of one job (one release) with different micro-batches (calib/pairwise.py)."""

    larger: str
    """Row id of the layout with the larger micro-batch."""
    smaller: str
    generation: str
    model_ratio: float
    """Model step of the larger-micro-batch layout / the other's."""
    measured_ratio: float

    @property
    def over_credit(self) -> float:
        """log(measured ratio / model ratio): > 0 where the model makes the larger micro-batch's
        layout faster, relative to the other, than the measurements do."""
        return math.log(self.measured_ratio / self.model_ratio)


@cache
def micro_batch_pairs() -> tuple[MicroBatchPair, ...]:
    """Every pair of measured layouts of one job that differ in the micro-batch (among other
    knobs), with the model's and the measured step ratio, as ``meshplan validate`` estimates them."""
    out = []
    for csv in PUBLISHED_RUNS:
        runs, skipped = load_runs(runs_csv(csv))
        by_id = {r.row_id: r for r in runs}
        for p in pairs(runs, evaluate(runs, skipped).rows):
            if "mb" not in p.knobs:
                continue
            a, b = by_id[p.a], by_id[p.b]
            flip = a.plan.micro_batch < b.plan.micro_batch
            big, small = (b, a) if flip else (a, b)
            sign = -1.0 if flip else 1.0
            out.append(MicroBatchPair(big.row_id, small.row_id, _generation(big),
                                      math.exp(sign * p.model_log_ratio), math.exp(sign * p.measured_log_ratio)))
    return tuple(out)


def micro_batch_evidence(run: Run) -> tuple[bool, str]:
    """(the measured micro-batch pairs on the run's GPU generation show the model crediting the
    larger micro-batch by more than ``MEASURED_TIE``, what they show in words)."""
    gen = _generation(run)
    found = [p for p in micro_batch_pairs() if p.generation == gen]
    if not found:
        return False, f"no measured pair of layouts differing in the micro-batch on {gen}"
    over = statistics.median(p.over_credit for p in found)
    words = (f"the {len(found)} measured pairs of layouts differing in the micro-batch on {gen} "
             f"(rows {', '.join(f'{p.larger}/{p.smaller}' for p in found[:6])}{' ...' if len(found) > 6 else ''}): "
             f"the model credits the larger micro-batch {math.expm1(over):+.0%} (median) beyond the measurements")
    return over > math.log1p(MEASURED_TIE), words
