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


ELIDE_ABOVE_MICROBATCHES = 32
"""Above this many micro-batches the steady state (every rank busy, the same pattern again and
again) is cut out of the chart: the warm-up and the cool-down, where the bubble is, stay readable."""

KEPT_MICROBATCHES = 2
"""Micro-batches beyond the pipeline's warm-up kept on each side of an elided steady state."""

RANK_ROW_IN = 0.55
"""Height of one pipeline rank's row in the chart (inches)."""

LEGEND_MARGIN_IN = 0.95
"""Below the rows: tick labels, the axis label and the legend (inches, at 7-8 pt)."""

TITLE_MARGIN_IN = 0.4
"""Above the rows: the title and the elision note (inches)."""


def elided_window(step: StepTimeline) -> tuple[float, float] | None:
    """(start, end) seconds of the steady state to leave out of the chart, or None to draw it all:
    from the end of the forward of micro-batch pp + KEPT to the start of the backward of
    micro-batch m - pp - KEPT (on any rank)."""
    tl = step.timeline
    m = tl.num_microbatches
    if m <= ELIDE_ABOVE_MICROBATCHES:
        return None
    head = max((o.end_s for o in tl.ops if o.kind == OpKind.FORWARD and o.microbatch < tl.pp + KEPT_MICROBATCHES),
               default=0.0)
    tail = min((o.start_s for o in tl.ops
                if o.kind != OpKind.FORWARD and o.microbatch >= m - tl.pp - KEPT_MICROBATCHES),
               default=tl.makespan_s)
    return (head, tail) if tail > head else None


def _draw(ax, step: StepTimeline, label_min_s: float) -> None:
    tl = step.timeline
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
            if o.compute_s > label_min_s:
                ax.text(o.start_s + o.compute_s / 2, y, str(o.microbatch), ha="center", va="center",
                        fontsize=6, color="white", clip_on=True)
        if step.tail_s > 0:
            ax.broken_barh([(tl.makespan_s, step.tail_s)], band, facecolors=COLORS["tail"])


def timeline_png(step: StepTimeline, title: str = "") -> bytes:
    """Gantt chart (one row per pipeline rank) as PNG bytes; a long step's steady state is
    elided (:func:`elided_window`), drawn as two panels with the cut marked."""
    import matplotlib.pyplot as plt

    fig = timeline_figure(step, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def timeline_figure(step: StepTimeline, title: str = ""):
    """The matplotlib figure :func:`timeline_png` renders (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = step.timeline
    end = step.step_s
    cut = elided_window(step)
    # margins in inches, so the tick labels, the axis label and the legend below never overlap
    # whatever the number of ranks (a figure-fraction margin shrinks with a one-rank chart)
    height = RANK_ROW_IN * max(tl.pp, 1) + LEGEND_MARGIN_IN + TITLE_MARGIN_IN
    if cut is None:
        fig, ax = plt.subplots(figsize=(12, height), dpi=110)
        axes = [ax]
        _draw(ax, step, end / 90)
        ax.set_xlim(0, end * 1.01)
    else:
        head_s, tail_s = cut[0], end - cut[1]
        fig, axes = plt.subplots(1, 2, sharey=True, figsize=(12, height), dpi=110,
                                 gridspec_kw={"width_ratios": [head_s, tail_s], "wspace": 0.04})
        shown = head_s + tail_s
        for ax in axes:
            _draw(ax, step, shown / 90)
        axes[0].set_xlim(0, cut[0])
        axes[1].set_xlim(cut[1], end * 1.005)
        axes[0].spines["right"].set_linestyle((0, (4, 3)))
        axes[1].spines["left"].set_linestyle((0, (4, 3)))
        axes[1].tick_params(left=False)
        axes[1].text(0.0, 1.02, f" ... {cut[1] - cut[0]:.3f} s of steady state elided",
                     transform=axes[1].transAxes, fontsize=7, va="bottom")
    ax = axes[0]
    ax.set_yticks(range(tl.pp), [f"rank {tl.pp - 1 - y}" for y in range(tl.pp)])
    for a in axes:
        a.set_xlabel("seconds into the step")
    label = f"{tl.schedule.value}, pp={tl.pp}, vpp={tl.vpp}, {tl.num_microbatches} micro-batches"
    fig.suptitle(f"{title}  ({label})" if title else label, fontsize=10)
    handles = [Patch(color=COLORS[OpKind.FORWARD], label="forward"),
               Patch(color=COLORS[OpKind.BACKWARD], label="backward (+recompute)"),
               Patch(color=COLORS["comm"], label="exposed communication"),
               Patch(color=COLORS["bubble"], label="bubble (idle)"),
               Patch(color=COLORS["tail"], label="DP reduce + optimizer")]
    if any(o.kind == OpKind.WEIGHT_GRAD for o in tl.ops):
        handles.insert(2, Patch(color=COLORS[OpKind.WEIGHT_GRAD], label="weight gradient (W)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    # room for the legend below and the title above (tight_layout cannot place two shared panels)
    fig.subplots_adjust(left=0.07, right=0.99, top=1 - TITLE_MARGIN_IN / height,
                        bottom=LEGEND_MARGIN_IN / height, wspace=0.04)
    return fig
