"""`meshplan plan`: search every parallel plan and print the Pareto frontier (time vs memory)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from meshplan.cli.common import ClusterProfileOpt, JsonOpt, MemoryGibOpt, console, err_console, print_json, path_value
from meshplan.cli.checks import explain_gpu_range, memory_budget_gib, nodes_and_gpus, output_path
from meshplan.cli.flags import ClusterFlags, ModelFlags, TrainingFlags, with_flags
from meshplan.cli.main import app
from meshplan.cli.plan_output import _nothing_fits, _print_frontier, _print_scaling, _to_json
from meshplan.errors import MeshplanError
from meshplan.numbers import check_count
from meshplan.plan import Job
from meshplan.spec.cluster import GIB, ClusterSpec
from meshplan.spec.training import Precision, TrainingSpec
from meshplan.targets import Target, plan_target

PROGRESS_AFTER_S = 1.0
"""Show a progress bar only once a search has run this long (short searches stay quiet)."""
MAX_GPU_COUNTS = 12
"""Searches one ``plan --gpus`` runs (a count, a list or a range): 8-16384 is 12. Each takes 0.1 to
20 s on this CPU (dense targets under a second, Qwen3-30B on 256 GPUs about 20 s: docs/search.md),
so a range past that is a typo or a job for several calls."""


def parse_gpu_counts(text: str) -> list[int]:
    """``8``, ``64,128,256`` or ``64-256`` (powers of two from 64 to 256)."""
    try:
        if "-" in text:
            lo_s, hi_s = text.split("-", 1)
            lo, hi = check_count("--gpus", int(lo_s)), check_count("--gpus", int(hi_s))
            if hi < lo:
                raise ValueError
            counts, n = [], lo
            while n <= hi and len(counts) <= MAX_GPU_COUNTS:
                counts.append(n)
                n *= 2
            if n <= hi:  # stopped early: say how many the range holds
                counts = [lo * 2**k for k in range((hi // lo).bit_length())]
            return _few_enough(text, counts)
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except MeshplanError:
        raise
    except ValueError:
        raise MeshplanError(f"--gpus {text!r}: give a count, a list (64,128) or a range (64-256)") from None
    if not counts or counts[0] < 1:
        raise MeshplanError(f"--gpus {text!r}: GPU counts must be positive")
    for n in counts:
        check_count("--gpus", n)
    return _few_enough(text, counts)


def _few_enough(text: str, counts: list[int]) -> list[int]:
    if len(counts) > MAX_GPU_COUNTS:
        raise MeshplanError(f"--gpus {text}: {len(counts)} GPU counts ({counts[0]} to {counts[-1]}), one search each; "
                            f"at most {MAX_GPU_COUNTS} in one call: narrow the range")
    return counts


class _LazyProgress:
    """A rich progress bar on stderr over all of a call's searches; it appears only when they run
    long. ``start(i, label)`` begins search ``i`` of ``searches``."""

    def __init__(self, enabled: bool, searches: int) -> None:
        self.enabled, self.searches = enabled, searches
        self.start_s = time.perf_counter()
        self.bar: Progress | None = None
        self.task = None
        self.index, self.label = 0, ""

    def start(self, index: int, label: str) -> None:
        self.index = index
        self.label = label if self.searches == 1 else f"search {index + 1}/{self.searches}, {label}"

    def __call__(self, what: str, fraction: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.start_s < PROGRESS_AFTER_S:
                return
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                console=err_console(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=float(self.searches))
        self.bar.update(self.task, completed=self.index + fraction, description=f"{self.label}: {what}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command("plan")
@with_flags(model_flags=ModelFlags, cluster_flags=ClusterFlags, training_flags=TrainingFlags)
def plan_cmd(
    *,
    model_flags: ModelFlags,
    cluster_flags: ClusterFlags,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="GPU count(s): 64, a list 64,128,256, or a range lo-hi: lo doubled up to hi (64-256 is 64,128,256); at most 12 counts, one search each.")] = None,
    training_flags: TrainingFlags,
    memory_gib: MemoryGibOpt = None,
    top: Annotated[int, typer.Option("--top", help="Frontier rows to print around the recommended plan (0: all).")] = 20,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=path_value, help="Write the recommended plan as a Job file (JSON).")] = None,
    pick: Annotated[Optional[int], typer.Option("--pick", help="With --out: write frontier point N (as numbered in the table) instead.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", parser=path_value, help="Draw the frontier (time vs memory) to this image file.")] = None,
    cluster_profile: ClusterProfileOpt = None,
    compare_file: Annotated[Optional[Path], typer.Option("--compare", parser=path_value, help="A Job file (e.g. from `meshplan import`): show where it stands against the frontier. Model, cluster, sequence, batch, precision and optimizer default to the file's.")] = None,
    target: Annotated[Optional[Target], typer.Option("--target", help="The stack that will run the plan: the search keeps only what it can run (meshplan: `meshplan train`) and estimates with its calibration; --out records it. Default: --compare's file's, else meshplan.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Search every parallel plan; print the Pareto frontier of step time vs memory per GPU."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.search.memory_margin import plan_margin
    from meshplan.search.planner import search
    from meshplan.targets import check_runs, search_options

    output_path(out, "--out", "plan file")
    output_path(plot, "--plot", "frontier plot")
    if top < 0:
        raise MeshplanError(f"--top must be >= 0 (0: all rows), got {top}")
    mine = Job.load(compare_file) if compare_file is not None else None
    target = plan_target(target, mine.target if mine else None)
    spec = model_flags.spec(mine.model if mine else None,
                            missing="give --model (a preset or config.json), or --compare JOB.json to plan for its model")
    counts = parse_gpu_counts(gpus) if gpus else None
    nodes_and_gpus(cluster_flags.nodes, counts, gpus)
    if mine is not None and not cluster_flags.given:
        base = _job_cluster(mine, counts)
    else:
        base = cluster_flags.spec(gpus=counts[0] if counts and len(counts) == 1 else None,
                                  use_nodes=counts is None or len(counts) == 1)
    training = training_flags.spec(mine.training if mine else None, _default_precision(base))
    try:
        sizes = [base] if counts is None or len(counts) == 1 else [base.with_gpus(n) for n in counts]
    except MeshplanError as exc:
        raise explain_gpu_range(gpus, counts, exc) from None
    hardware = [resolve_hardware(cl, training.precision, cluster_profile, target.value) for cl in sizes]
    clusters = [hw.cluster for hw in hardware]
    memory_budget_gib(memory_gib, base.gpu)
    if pick is not None and pick < 0:
        raise MeshplanError(f"--pick must be a frontier index >= 0, got {pick}")
    if pick is not None and out is None:
        raise MeshplanError(f"--pick {pick} chooses the frontier point --out writes: give --out FILE")
    budget = None if memory_gib is None else memory_gib * GIB
    results = []
    if len(hardware) > 1 and not json_out:
        err_console().print(f"[dim]{len(hardware)} searches, one per GPU count: "
                            f"{', '.join(str(hw.cluster.num_gpus) for hw in hardware)}[/dim]")
    bar = _LazyProgress(not json_out, len(hardware))
    try:
        for i, hw in enumerate(hardware):
            bar.start(i, f"{hw.cluster.num_gpus} GPUs")
            results.append(search(spec, hw.cluster, training, calib=hw.calib, budget_bytes=budget, progress=bar,
                                  options=search_options(target, spec, training)))
    finally:
        bar.close()

    choices = [robust_recommendation(r, cl, spec, training) for r, cl in zip(results, clusters)]
    # the recommended plan's allocated / reserved / device peaks and the headroom asked (issue 14, 15)
    margins = [None if c is None else plan_margin(spec, hw.cluster, training, r.frontier[c.index].plan, hw.calib,
                                                  r.budget_bytes / GIB) for r, c, hw in zip(results, choices, hardware)]
    chosen_idx = max(range(len(results)), key=lambda i: -_best_time(results[i]))
    chosen, chosen_cluster = results[chosen_idx], clusters[chosen_idx]
    if all(r.recommended is None for r in results) and pick is None:
        raise MeshplanError(_nothing_fits(results, spec.name, memory_gib))
    if pick is not None and pick >= len(chosen.frontier):
        raise MeshplanError(f"--pick {pick}: the frontier has {len(chosen.frontier)} points (0..{len(chosen.frontier) - 1})")

    written = None
    if out is not None:
        point = chosen.frontier[pick if pick is not None else choices[chosen_idx].index]
        # the search kept only what the target runs; this says so before a file exists (belt and braces)
        check_runs(target, spec, training, point.plan)
        job = Job(model=spec, training=training, cluster=chosen_cluster, plan=point.plan,
                  target=None if target == Target.MESHPLAN else target.value)
        try:
            job.save(out)
        except OSError as exc:
            raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None
        written = str(out)
    comparison = None
    if mine is not None:  # meshplan.report.compare (export helper's module)
        from meshplan.report.compare import compare_job

        at = next((i for i, r in enumerate(results) if r.num_gpus == mine.cluster.num_gpus), chosen_idx)
        res = results[at]
        comparison = compare_job(mine, res.frontier, res.budget_bytes / GIB, model=spec, training=training,
                                 num_gpus=res.num_gpus, hardware=hardware[at],
                                 recommended=None if choices[at] is None else choices[at].index)
        comparison = _with_band(comparison, spec, training, clusters[at])
    if plot is not None:
        from meshplan.report.frontier_plot import plot_frontier

        plot_frontier(results, plot, title=f"{spec.name}, seq {training.seq_len}, batch {training.global_batch}",
                      recommended=[None if c is None else c.index for c in choices],
                      yours=None if comparison is None else comparison.yours)
    data = _data_aware(spec, training, chosen, choices[chosen_idx], chosen_cluster, hardware[chosen_idx])
    if json_out:
        print_json({**_to_json(results, choices, margins, training, written, str(plot) if plot else None),
                    "target": target.value,
                    **({"comparison": comparison.to_dict()} if comparison else {}),
                    **({"data_aware": data.to_dict()} if data else {})})
        return
    con = console()
    if comparison is not None:
        con.print(comparison.summary())
        if comparison.attribution is not None:
            from meshplan.report.attribution import attribution_table

            theirs = "recommended" if comparison.recommended is not None else "fastest that fits"
            con.print(attribution_table(comparison.attribution, f"Where the step times differ: step time per term "
                                        f"(yours vs {theirs})", theirs=theirs))
    for res, cl, choice, margin in zip(results, clusters, choices, margins):
        _print_frontier(con, res, cl, training, top, choice, target)
        if margin is not None:
            con.print(margin.text(), soft_wrap=True, markup=False, highlight=False)
    if len(results) > 1:
        _print_scaling(con, results, training)
    if data is not None:
        from meshplan.cli.cost_tables import data_aware_table

        con.print(data_aware_table(data, training))
    if written:
        which = f"frontier point {pick}" if pick is not None else "recommended plan"
        con.print(f"wrote the {which} to {written}")
    if plot is not None:
        con.print(f"wrote the frontier plot to {plot}")


def _data_aware(spec, training: TrainingSpec, res, choice, cluster: ClusterSpec, hw):
    """The recommended plan's step time under the document lengths: fixed against data-aware
    choices (cost/data_aware.py); None without --seq-len-dist or a recommendation."""
    from meshplan.cost.data_aware import data_aware_steps

    index = choice.index if choice is not None else res.recommended_index
    if training.seq_len_dist is None or index is None:
        return None
    return data_aware_steps(spec, cluster, training, res.frontier[index].plan, hw.calib)


def _with_band(comparison, spec, training: TrainingSpec, cluster: ClusterSpec):
    """The comparison with the model's measured error on the ratio of yours and the target
    (meshplan.search.robust.band_basis): a gain within it is a tie by the data."""
    from dataclasses import replace

    from meshplan.cost.calibration import gpu_family
    from meshplan.search.robust import band_basis, model_error

    if comparison.target is None:
        return comparison
    err = model_error(spec.is_moe, training.precision.value, gpu_family(cluster.gpu))
    band, basis = band_basis(err, comparison.yours.plan, comparison.target.plan)
    return replace(comparison, band=band, band_basis=basis)


def robust_recommendation(res, cluster: ClusterSpec, spec, training: TrainingSpec):
    """The recommendation robust to the model's error (meshplan.search.robust), or None."""
    from meshplan.cost.calibration import gpu_family
    from meshplan.search.robust import model_error, robust_choice

    err = model_error(spec.is_moe, training.precision.value, gpu_family(cluster.gpu))
    return robust_choice(res.frontier, res.budget_bytes, res.recommended_index, err)


def _job_cluster(mine: Job, counts: list[int] | None) -> ClusterSpec:
    """The --compare Job file's cluster (no --cluster/--gpu/--nodes/--gpus-per-node given):
    its hardware, resized when --gpus gives one count."""
    return mine.cluster if not counts or len(counts) > 1 else mine.cluster.with_gpus(counts[0])


def _default_precision(cluster: ClusterSpec) -> Precision:
    """bf16 where the GPU has it, else fp16, else fp32 (the ``cpu`` preset computes in fp32)."""
    for p in (Precision.BF16, Precision.FP16, Precision.FP32):
        try:
            cluster.gpu.peak_flops(p)
            return p
        except MeshplanError:
            continue
    return Precision.FP32


def _best_time(res) -> float:
    rec = res.recommended
    return rec.step_time_s if rec is not None else float("inf")
