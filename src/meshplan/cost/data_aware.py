"""What the data's document lengths change in one plan's step time: the plan with every sequence
one document, with the fixed choices (documents in data order, CP over every sequence), with the
data-aware ones (token- and attention-balanced documents, per-bucket CP), and the bound of a
perfectly balanced step. cost/packing.py holds the model; this compares its variants."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from meshplan.cost.calibration import Calibration
from meshplan.cost.step import estimate
from meshplan.plan import Plan
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.seqlen import DocBalance
from meshplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class DataAwareSteps:
    """Step times (s) of one plan on one distribution of document lengths."""

    full_sequences_s: float
    """Every sequence one document of seq_len tokens (the estimate without --seq-len-dist)."""
    fixed_s: float
    """Packed documents, in data order to the dp ranks, CP over every sequence."""
    chosen_s: float
    """With the training's own choices (--doc-balance, --cp-buckets)."""
    aware_s: float
    """Balanced documents, and per-bucket CP when the plan has cp > 1."""
    balanced_bound_s: float
    """Every dp rank the mean attention work, the training's own bucket setting: no straggler."""

    @property
    def straggler_s(self) -> float:
        """What the imbalance across dp ranks costs the chosen assignment."""
        return self.chosen_s - self.balanced_bound_s

    @property
    def gain_over_fixed(self) -> float:
        """Fraction of the fixed step time the data-aware choices save."""
        return 1.0 - self.aware_s / self.fixed_s

    def to_dict(self) -> dict[str, Any]:
        return {"full_sequences_step_s": self.full_sequences_s, "fixed_step_s": self.fixed_s,
                "chosen_step_s": self.chosen_s, "aware_step_s": self.aware_s,
                "balanced_bound_step_s": self.balanced_bound_s, "straggler_s": self.straggler_s,
                "gain_over_fixed": self.gain_over_fixed}


def data_aware_steps(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                     calib: Calibration) -> DataAwareSteps | None:
    """The variants' step times; None when ``training`` has no sequence-length distribution."""
    if training.seq_len_dist is None:
        return None
    buckets = plan.dims.cp > 1

    def step(**changes: Any) -> float:
        return estimate(model, cluster, replace(training, **changes), plan, calib).step_time_s

    return DataAwareSteps(
        full_sequences_s=step(seq_len_dist=None, doc_balance=DocBalance.STREAM, cp_buckets=False),
        fixed_s=step(doc_balance=DocBalance.STREAM, cp_buckets=False),
        chosen_s=step(),
        aware_s=step(doc_balance=DocBalance.BALANCED, cp_buckets=buckets),
        balanced_bound_s=step(doc_balance=DocBalance.IDEAL))
