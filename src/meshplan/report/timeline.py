"""Timeline of one training step per pipeline rank, from the cost model's per-rank times.

The cost model gives, per pipeline rank, the time of one micro-batch over all its virtual
stages, and for the slowest rank the split into math, recompute and exposed communication
(:class:`meshplan.cost.step.Estimate`). Each virtual stage gets its rank's time in proportion
to its layers; forward is a third of the math and backward two thirds (backward = 2 x forward,
the cost model's own rule) plus the recompute; exposed communication is split evenly between
forward and backward. :func:`meshplan.report.schedule_sim.simulate` then orders the
operations by the plan's schedule. The tail (data-parallel reduce left exposed + optimizer
step) follows the last operation.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplan.report.schedule_sim import OpKind, StageTimes, Timeline, simulate

if TYPE_CHECKING:
    from meshplan.cost.step import Estimate
    from meshplan.plan import Plan


@dataclass(frozen=True)
class StepTimeline:
    timeline: Timeline
    tail_s: float
    """Per step after the pipeline: exposed data-parallel reduce + optimizer."""

    @property
    def step_s(self) -> float:
        return self.timeline.makespan_s + self.tail_s


def stage_times(plan: "Plan", est: "Estimate") -> list[StageTimes]:
    """Per virtual stage (model order) times of one micro-batch, from an estimate of ``plan``."""
    plan = est.plan  # the estimate's plan has its defaults (stage_layers) filled
    m = est.time.num_microbatches
    t_slow = max(s.microbatch_time_s for s in est.stages)
    math_mb = (est.time.compute_s - est.time.recompute_s) / m
    rec_mb = est.time.recompute_s / m
    comm_mb = max(t_slow - est.time.compute_s / m, 0.0)
    f_math, f_rec, f_comm = (x / t_slow if t_slow > 0 else 0.0 for x in (math_mb, rec_mb, comm_mb))
    out = []
    for i, n in enumerate(plan.stage_layers):
        rank = est.stages[plan.stage_rank(i)]
        share = n / rank.layers if rank.layers else 1.0 / plan.vpp
        t = rank.microbatch_time_s * share
        out.append(StageTimes(forward_s=t * f_math / 3, backward_s=t * (2 * f_math / 3 + f_rec),
                              forward_comm_s=t * f_comm / 2, backward_comm_s=t * f_comm / 2))
    return out


def step_timeline(est: "Estimate") -> StepTimeline:
    plan = est.plan
    m = est.time.num_microbatches
    tl = simulate(stage_times(plan, est), plan.dims.pp, plan.vpp, m, plan.schedule)
    t_slow = max(s.microbatch_time_s for s in est.stages)
    mb_comm_exposed = m * max(t_slow - est.time.compute_s / m, 0.0)
    dp_exposed = max(est.time.exposed_communication_s - mb_comm_exposed, 0.0)
    return StepTimeline(timeline=tl, tail_s=dp_exposed + est.time.optimizer_s)


COLORS = {
    OpKind.FORWARD: "#4C78A8",
    OpKind.BACKWARD: "#54A24B",
    OpKind.WEIGHT_GRAD: "#9BD08F",
    "comm": "#F58518",
    "tail": "#8C8C8C",
    "bubble": "#F2C6C6",
}


def timeline_png(step: StepTimeline, title: str = "") -> bytes:
    """Gantt chart (one row per pipeline rank) as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = step.timeline
    end = step.step_s
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.55 * tl.pp), dpi=110)
    for r in range(tl.pp):
        y = tl.pp - 1 - r  # rank 0 on top
        band = (y - 0.4, 0.8)
        ax.broken_barh([(0, tl.makespan_s)], band, color=COLORS["bubble"])  # idle shows through
        mine = [o for o in tl.ops if o.rank == r]
        for kind in OpKind:  # one artist per colour keeps thousands of operations fast to draw
            spans = [(o.start_s, o.compute_s) for o in mine if o.kind == kind]
            if spans:
                ax.broken_barh(spans, band, facecolors=COLORS[kind], edgecolor="white", linewidth=0.3)
        comm = [(o.start_s + o.compute_s, o.comm_s) for o in mine if o.comm_s > 0]
        if comm:
            ax.broken_barh(comm, band, facecolors=COLORS["comm"])
        for o in mine:
            if o.compute_s > end / 90:
                ax.text(o.start_s + o.compute_s / 2, y, str(o.microbatch), ha="center", va="center",
                        fontsize=6, color="white")
        if step.tail_s > 0:
            ax.broken_barh([(tl.makespan_s, step.tail_s)], band, facecolors=COLORS["tail"])
    ax.set_yticks(range(tl.pp), [f"rank {tl.pp - 1 - y}" for y in range(tl.pp)])
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("seconds into the step")
    label = f"{tl.schedule.value}, pp={tl.pp}, vpp={tl.vpp}, {tl.num_microbatches} micro-batches"
    ax.set_title(f"{title}  ({label})" if title else label, fontsize=10)
    handles = [Patch(color=COLORS[OpKind.FORWARD], label="forward"),
               Patch(color=COLORS[OpKind.BACKWARD], label="backward (+recompute)"),
               Patch(color=COLORS["comm"], label="exposed communication"),
               Patch(color=COLORS["bubble"], label="bubble (idle)"),
               Patch(color=COLORS["tail"], label="DP reduce + optimizer")]
    if any(o.kind == OpKind.WEIGHT_GRAD for o in tl.ops):
        handles.insert(2, Patch(color=COLORS[OpKind.WEIGHT_GRAD], label="weight gradient (W)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35 if tl.pp < 4 else -0.18),
              ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
