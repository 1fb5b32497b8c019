"""`meshplan export plan.json --to megatron|megatron-bridge|torchtitan|deepspeed`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from meshplan.cli.common import ClusterProfileOpt, JsonOpt, MemoryGibOpt, err_console, print_json, path_value
from meshplan.cli.checks import memory_budget_gib, output_path
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.export.common import ExportTarget, export_job
from meshplan.plan import Job
from meshplan.targets import Target

_STACK_OF = {ExportTarget.MEGATRON: Target.MEGATRON, ExportTarget.MEGATRON_BRIDGE: Target.MEGATRON,
             ExportTarget.TORCHTITAN: Target.TORCHTITAN, ExportTarget.DEEPSPEED: Target.DEEPSPEED}
"""The stack each export format is run by (Megatron-Bridge drives Megatron-Core)."""


def _framework(to: ExportTarget | None, target: Target | None) -> ExportTarget:
    """--to, or the framework of --target; refuses a pair that names two different stacks."""
    if target == Target.MESHPLAN:
        raise MeshplanError("--target meshplan: meshplan runs the Job file itself (`meshplan train`), "
                            "there is nothing to export; give --to or another --target")
    if to is None:
        if target is None:
            raise MeshplanError("give --to megatron|megatron-bridge|torchtitan|deepspeed (or --target)")
        return ExportTarget(target.value)
    if target is not None and _STACK_OF[to] != target:
        raise MeshplanError(f"--to {to.value} is run by {_STACK_OF[to].value}, not --target {target.value}")
    return to


@app.command("export")
def export(
    plan_file: Annotated[Path, typer.Argument(parser=path_value, help="A Job file from `meshplan plan --out` or `meshplan import`.")],
    to: Annotated[Optional[ExportTarget], typer.Option("--to", help="Target framework (default: --target's).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=path_value, help="Write the config here instead of stdout.")] = None,
    best: Annotated[bool, typer.Option("--best", help="Search the job's model, batch and cluster, and export the fastest plan that fits and that the target can express.")] = False,
    memory_gib: MemoryGibOpt = None,
    cluster_profile: ClusterProfileOpt = None,
    target: Annotated[Optional[Target], typer.Option("--target", help="The stack that will run the plan: --to defaults to it; with --best the search keeps only what it can run.")] = None,
    target_version: Annotated[Optional[str], typer.Option("--target-version", help="torchtitan: the version to write for (>= 0.3: command line; older: TOML). Default: the installed one, else the current release.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write a plan as Megatron-LM arguments, Megatron-Bridge overrides, a torchtitan command line (or TOML) or a DeepSpeed JSON."""
    to = _framework(to, target)
    if memory_gib is not None and not best:
        raise MeshplanError("--memory-gib is the budget of the --best search: give --best, or drop it")
    output_path(out, "--out", f"{to.value} config")
    job = Job.load(plan_file)
    memory_budget_gib(memory_gib, job.cluster.gpu)
    chosen = None
    if cluster_profile is not None and not best:
        raise MeshplanError("--cluster-profile only matters with --best (the search); drop it or add --best")
    fit: tuple[str, ...] = ()
    if best:
        chosen = _best_for_target(job, to, memory_gib, cluster_profile, target_version)
        result = chosen["export"]
    else:
        try:
            result = export_job(job, to, target_version)
        except MeshplanError as exc:  # the plan was made for another stack: say what gets one
            raise MeshplanError(f"{exc} (--best exports the fastest plan of this job that {to.value} can run)") from None
        fit = _fit_warning(job, to, plan_file)
    warnings = (*result.warnings, *fit)
    if out is not None:
        try:
            out.write_text(result.text)
        except OSError as exc:
            raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None
    if json_out:
        print_json({"target": result.target.value, "text": result.text, "warnings": list(warnings),
                    "out": str(out) if out else None,
                    **({"best": {k: v for k, v in chosen.items() if k != "export"}} if chosen else {})})
        return
    if chosen is not None:
        err_console().print(chosen["summary"])
    for w in warnings:
        err_console().print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    if out is None:
        sys.stdout.write(result.text)
    else:
        err_console().print(f"wrote {result.target.value} config to {out}")


def _fit_warning(job: Job, to: ExportTarget, plan_file: Path) -> tuple[str, ...]:
    """A warning when the plan does not fit its GPUs under the cost model with the calibration of
    the stack that runs the export (a config written for a run that would run out of memory);
    none when it fits."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cost import estimate

    stack = _STACK_OF[to].value
    hw = resolve_hardware(job.cluster, job.training.precision, None, stack)
    est = estimate(job.model, hw.cluster, job.training, job.plan, calib=hw.calib)
    if est.fits:
        return ()
    return (f"the plan does not fit: it needs {est.fit_memory_gib:.1f} GiB per GPU, {job.cluster.gpu.name} has "
            f"{est.gpu_memory_gib:.1f} GiB ({stack} calibration; `meshplan estimate --plan {plan_file}` itemises it); "
            "--best exports the fastest plan of this job that fits",)


def _best_for_target(job: Job, target: ExportTarget, memory_gib: float | None, profile: str | None,
                     version: str | None) -> dict:
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cli.plan_cmd import robust_recommendation
    from meshplan.export.common import best_expressible, search_options_for
    from meshplan.search.planner import search
    from meshplan.spec.cluster import GIB

    stack = "megatron" if target is ExportTarget.MEGATRON_BRIDGE else target.value  # its calibration
    hw = resolve_hardware(job.cluster, job.training.precision, profile, stack)
    res = search(job.model, hw.cluster, job.training, calib=hw.calib, options=search_options_for(target),
                 budget_bytes=None if memory_gib is None else memory_gib * GIB)
    budget = res.budget_bytes / GIB
    # the plan `meshplan plan --target` recommends (robust to the model's error, not merely the
    # fastest that fits: before, --best wrote ckpt=full:19 at 78.7 of 79.7 GiB for the README's
    # llama3-70b job while plan recommended ckpt=full:26, and called it "the recommended plan")
    choice = robust_recommendation(res, hw.cluster, job.model, job.training)
    found = None
    if choice is not None:
        found = best_expressible(job, res.frontier[choice.index:choice.index + 1], target, budget, version)
        found = None if found is None else (choice.index, found[1])
    found = found or best_expressible(job, res.frontier, target, budget, version)
    if found is None:
        raise MeshplanError(f"no frontier plan within {budget:.1f} GiB per GPU can be expressed in {target.value}")
    i, export = found
    top_index = choice.index if choice is not None else res.recommended_index
    point, top = res.frontier[i], (None if top_index is None else res.frontier[top_index])
    loss = 1 - point.tokens_per_s_per_gpu / top.tokens_per_s_per_gpu if top else 0.0
    summary = (f"frontier point {i}: {point.plan.notation()} ({point.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
               f"{point.peak_memory_gib:.1f} GiB)" + (f", {loss:.0%} slower than the recommended plan "
               f"{top.plan.notation()} that {target.value} cannot express" if i != top_index else
               ", the recommended plan"))
    return {"index": i, "plan": point.plan.notation(), "tokens_per_s_per_gpu": point.tokens_per_s_per_gpu,
            "peak_memory_gib": point.peak_memory_gib, "fit_memory_gib": point.fit_memory_gib, "summary": summary, "export": export}
