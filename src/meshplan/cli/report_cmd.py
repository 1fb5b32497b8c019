"""`meshplan report`: one self-contained HTML file for a planning run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from meshplan.cli.common import (ClusterOpt, GlobalBatchOpt, GlobalBatchTokensOpt, GpuOpt, GpusPerNodeOpt,
                                 JsonOpt, NodesOpt, OptimizerOpt, OverrideOpt, PrecisionOpt, err_console,
                                 load_cluster, load_model, make_training, print_json)
from meshplan.cli.checks import memory_budget_gib, output_path, refuse_with
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.spec.training import Optimizer, Precision


@app.command("report")
def report(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")],
    plan_file: Annotated[Optional[Path], typer.Option("--plan", help="A Job file (yours): its model, cluster and batch are planned, and it is compared with the frontier.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Preset or config.json (without --plan).")] = None,
    override: OverrideOpt = None,
    cluster: ClusterOpt = None,
    gpu: GpuOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length (without --plan).")] = None,
    global_batch: GlobalBatchOpt = None,
    global_batch_tokens: GlobalBatchTokensOpt = None,
    precision: PrecisionOpt = Precision.BF16,
    optimizer: OptimizerOpt = Optimizer.ADAMW,
    memory_gib: Annotated[Optional[float], typer.Option("--memory-gib", help="Memory budget per GPU (default: GPU memory less the search's safety margin).")] = None,
    pick: Annotated[Optional[int], typer.Option("--pick", help="Chart this frontier point instead of the recommended plan (or yours).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write an HTML report: frontier plot and table, memory per pipeline rank, step timeline."""
    from meshplan.report.build import build_report

    output_path(out, "--out", "HTML report")
    yours = None
    if plan_file is not None:
        refuse_with(ctx, ("model", "override", "cluster", "gpu", "nodes", "gpus_per_node", "seq_len", "global_batch",
                          "global_batch_tokens", "precision", "optimizer"),
                    because="--plan brings its own model, cluster and batch")
        job = Job.load(plan_file)
        spec, spec_cluster, training, yours = job.model, job.cluster, job.training, job.plan
    else:
        if model is None or seq_len is None:
            raise MeshplanError("give --plan FILE, or --model, --seq-len, a batch and a cluster")
        spec = load_model(model, override)
        spec_cluster = load_cluster(cluster, gpu, nodes, gpus_per_node)
        training = make_training(seq_len, global_batch, global_batch_tokens, precision, optimizer)
    memory_budget_gib(memory_gib, spec_cluster.gpu)
    built = build_report(spec, spec_cluster, training, yours=yours, pick=pick, budget_gib=memory_gib)
    try:
        out.write_text(built.html)
    except OSError as exc:
        raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None
    if json_out:
        print_json({"out": str(out), "chosen": built.chosen.notation(), "frontier_size": built.frontier_size,
                    "budget_gib": built.budget_gib,
                    "comparison": None if built.comparison is None else built.comparison.to_dict()})
        return
    if built.comparison is not None:
        err_console().print(built.comparison.summary())
    err_console().print(f"wrote {out} ({len(built.html) / 1024:.0f} KiB, {built.frontier_size} frontier plans)")
