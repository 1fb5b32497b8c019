"""`meshplan report`: one self-contained HTML file for a planning run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from meshplan.cli.common import ClusterProfileOpt, JsonOpt, MemoryGibOpt, err_console, print_json, path_value
from meshplan.cli.checks import memory_budget_gib, output_path, refuse_with
from meshplan.cli.flags import ClusterFlags, ModelFlags, TrainingFlags, with_flags
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.targets import Target, plan_target


@app.command("report")
@with_flags(model_flags=ModelFlags, cluster_flags=ClusterFlags, training_flags=TrainingFlags)
def report(
    ctx: typer.Context,
    *,
    out: Annotated[Path, typer.Option("--out", "-o", parser=path_value, help="HTML file to write.")],
    plan_file: Annotated[Optional[Path], typer.Option("--plan", parser=path_value, help="A Job file (yours): its model, cluster and batch are planned, and it is compared with the frontier.")] = None,
    model_flags: ModelFlags,
    cluster_flags: ClusterFlags,
    training_flags: TrainingFlags,
    memory_gib: MemoryGibOpt = None,
    pick: Annotated[Optional[int], typer.Option("--pick", help="Chart this frontier point instead of the recommended plan (or yours).")] = None,
    cluster_profile: ClusterProfileOpt = None,
    target: Annotated[Optional[Target], typer.Option("--target", help="The stack that runs the plans: its calibration (overlap, host costs, fitted efficiencies); the frontier keeps only what it can run; warns when yours cannot. Default: the one --plan's file was planned for, else meshplan.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write an HTML report: frontier plot and table, memory per pipeline rank, step timeline."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.report.build import build_report

    output_path(out, "--out", "HTML report")
    yours = None
    if plan_file is not None:
        refuse_with(ctx, ("model", "override", "cluster", "gpu", "nodes", "gpus_per_node", "seq_len", "global_batch",
                          "global_batch_tokens", "precision", "recipe", "optimizer"),
                    because="--plan brings its own model, cluster and batch")
        job = Job.load(plan_file)
        spec, spec_cluster, training, yours = job.model, job.cluster, job.training, job.plan
        target = plan_target(target, job.target)  # the stack the file was planned for
    else:
        if model_flags.model is None or training_flags.seq_len is None:
            raise MeshplanError("give --plan FILE, or --model, --seq-len, a batch and a cluster")
        spec = model_flags.spec()
        spec_cluster = cluster_flags.spec()
        training = training_flags.spec()
    target = target or Target.MESHPLAN
    memory_budget_gib(memory_gib, spec_cluster.gpu)
    hw = resolve_hardware(spec_cluster, training.precision, cluster_profile, target.value)
    refused = None
    if yours is not None:
        from meshplan.cli.estimate_cmd import warn_if_refused

        refused = warn_if_refused(target, spec, training, yours)
    built = build_report(spec, hw.cluster, training, yours=yours, pick=pick, budget_gib=memory_gib, calib=hw.calib,
                         target=target)
    try:
        out.write_text(built.html)
    except OSError as exc:
        raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None
    if json_out:
        print_json({"out": str(out), "chosen": built.chosen.notation(), "frontier_size": built.frontier_size,
                    "budget_gib": built.budget_gib, "target": target.value, "yours_refused": refused,
                    "comparison": None if built.comparison is None else built.comparison.to_dict()})
        return
    if built.comparison is not None:
        err_console().print(built.comparison.summary())
    err_console().print(f"wrote {out} ({len(built.html) / 1024:.0f} KiB, {built.frontier_size} frontier plans)")
