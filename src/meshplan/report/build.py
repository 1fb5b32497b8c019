"""Assemble a report: search the frontier for a job's model, cluster and batch, estimate the
chosen plan, compare a given plan, and render the HTML (library side of `meshplan report`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost import estimate
from meshplan.cost.calibration import Calibration, gpu_family
from meshplan.errors import MeshplanError
from meshplan.plan import Job, Plan
from meshplan.report.attribution import attribute
from meshplan.report.compare import Comparison, compare
from meshplan.report.html import ReportInput, render_html
from meshplan.spec.cluster import GIB, ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec
from meshplan.search.robust import model_error, robust_choice
from meshplan.targets import Target, search_options


@dataclass(frozen=True)
class BuiltReport:
    html: str
    chosen: Plan
    comparison: Comparison | None
    frontier_size: int
    budget_gib: float


def _frontier_png(result, title: str, yours=None, recommended: int | None = None) -> bytes:
    """The search's frontier plot (meshplan.report.frontier_plot), as PNG bytes."""
    import tempfile
    from pathlib import Path

    from meshplan.report.frontier_plot import plot_frontier

    with tempfile.TemporaryDirectory() as tmp:
        return plot_frontier([result], Path(tmp) / "frontier.png", title=title, yours=yours,
                             recommended=[recommended]).read_bytes()


def build_report(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                 yours: Plan | None = None, pick: int | None = None,
                 budget_gib: float | None = None, title: str | None = None,
                 calib: Calibration | None = None, target: Target | str = Target.MESHPLAN) -> BuiltReport:
    """Search, then chart ``yours`` (when given, compared with the frontier) or frontier point
    ``pick`` (default: the recommended plan, the fastest that fits). ``cluster`` and ``calib``:
    the resolved hardware (``calib.hardware.resolve_hardware``); ``target``: the stack that will run
    the plan (the frontier holds only what it can run)."""
    from meshplan.search.planner import search

    result = search(model, cluster, training, calib=calib,
                    budget_bytes=None if budget_gib is None else budget_gib * GIB,
                    options=search_options(target, model, training))
    budget = result.budget_bytes / GIB
    frontier = result.frontier
    robust = robust_choice(frontier, result.budget_bytes, result.recommended_index,
                           model_error(model.is_moe, training.precision.value, gpu_family(cluster.gpu)))
    recommended_index = None if robust is None else robust.index
    comparison = None
    chosen_index: int | None
    if pick is not None:
        if not 0 <= pick < len(frontier):
            raise MeshplanError(f"--pick {pick} is not a frontier index (0..{len(frontier) - 1})")
        chosen_index = pick
        plan = frontier[pick].plan
    elif yours is not None:
        plan, chosen_index = yours, None
    else:
        chosen_index = recommended_index
        if chosen_index is None:
            raise MeshplanError(
                f"no plan fits {budget:.1f} GiB per GPU (the leanest needs "
                f"{result.min_memory_bytes / GIB:.1f} GiB): use more GPUs, recompute or a larger budget")
        plan = frontier[chosen_index].plan
    est = estimate(model, cluster, training, plan, calib)
    yours_est = None
    if yours is not None:
        yours_est = est if pick is None else estimate(model, cluster, training, yours, calib)
        comparison = compare(yours_est, frontier, budget, recommended_index)
        if comparison.target is not None:
            target_est = estimate(model, cluster, training, comparison.target.plan, calib)
            comparison = replace(comparison, attribution=attribute(yours_est, target_est))
    job = Job(model=model, training=training, cluster=cluster, plan=plan)
    notes = [f"Search: {result.global_configs:,} global configurations, {result.plans_evaluated:,} "
             f"plans evaluated in {result.elapsed_s:.1f} s."]
    if robust is not None:
        notes.append(f"Recommended #{robust.index}: {robust.why}.")
    html = render_html(ReportInput(
        title=title or f"meshplan report: {model.name} on {cluster.num_gpus} x {cluster.gpu.name}",
        job=job, estimate=est, frontier=frontier, chosen_index=chosen_index,
        recommended_index=recommended_index, budget_gib=budget,
        frontier_png=_frontier_png(result, f"{model.name}, seq {training.seq_len}, batch {training.global_batch}",
                                   yours_est, recommended_index) if frontier else None,
        comparison=comparison, yours=yours_est, notes=notes))
    return BuiltReport(html=html, chosen=est.plan, comparison=comparison, frontier_size=len(frontier),
                       budget_gib=budget)
