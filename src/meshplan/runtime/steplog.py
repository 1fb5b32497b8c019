"""What a run reports as it goes: the per-step record, the JSON-lines log, the progress bar."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    step: int
    loss: float
    step_time_s: float
    tokens_per_s: float
    peak_memory_gib: float
    mfu: float | None = None
    lr: float | None = None
    """Learning rate this step's update used (runtime/schedule.py)."""
    grad_norm: float | None = None
    """Global gradient norm before clipping (only when clipping)."""
    eval_loss: float | None = None
    """Held-out loss after this step (only on evaluation steps)."""
    expert_imbalance: tuple[float, ...] | None = None
    """Per MoE layer, the busiest expert's routed tokens over the mean this step (MoE models)."""


class LogWriter:
    """Rank 0's JSON-lines log: one object per step, then a summary (steady steps only)."""

    def __init__(self, path: str | None) -> None:
        self.file = open(path, "w") if path else None

    def write(self, rec: StepRecord) -> None:
        if self.file:
            self.file.write(json.dumps(asdict(rec)) + "\n")
            self.file.flush()

    def summary(self, records: list[StepRecord], notation: str, world: int, loop: dict | None = None) -> None:
        """``loop``: the run's optimizer-step settings (schedule, clipping, weight-decay groups)."""
        if not self.file:
            return
        steady = records[1:] or records  # the first step pays for warm-up
        mfus = [r.mfu for r in steady if r.mfu is not None]
        imbalances = [sum(r.expert_imbalance) / len(r.expert_imbalance) for r in records if r.expert_imbalance]
        self.file.write(json.dumps({
            "summary": True, "steps": len(records), "plan": notation, "world_size": world,
            "first_loss": records[0].loss if records else None,
            "final_loss": records[-1].loss if records else None,
            "mean_step_time_s": sum(r.step_time_s for r in steady) / max(1, len(steady)),
            "mean_tokens_per_s": sum(r.tokens_per_s for r in steady) / max(1, len(steady)),
            "peak_memory_gib": max((r.peak_memory_gib for r in records), default=0.0),
            "mfu": sum(mfus) / len(mfus) if mfus else None,
            "mean_expert_imbalance": sum(imbalances) / len(imbalances) if imbalances else None,
            "final_eval_loss": next((r.eval_loss for r in reversed(records) if r.eval_loss is not None), None),
            "loop": loop or {},
        }) + "\n")
        self.file.close()


class ProgressBar:
    """rich progress bar on rank 0 (stderr), showing the latest loss."""

    def __init__(self, total: int, enabled: bool, done: int = 0) -> None:
        """``done``: the steps a resumed run starts after (20 of 40 at the start, not 0 of 40)."""
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                console=Console(stderr=True))
            self.task = self.bar.add_task("train", total=total, completed=done, info="")
            self.bar.start()

    def advance(self, rec: StepRecord) -> None:
        if self.bar:
            experts = f"  busiest expert {max(rec.expert_imbalance):.2f}x" if rec.expert_imbalance else ""
            self.bar.update(self.task, advance=1,
                            info=f"loss {rec.loss:.4f}  {rec.tokens_per_s:,.0f} tok/s{experts}")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()
