"""`meshplan estimate`: the cost of one parallel plan, as tables or one JSON object."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.checks import needs, refuse_with
from meshplan.cli.common import ClusterProfileOpt, JsonOpt, console, err_console, print_json
from meshplan.cli.cost_tables import data_aware_table, expert_load_table, osdp_memory_rows, time_breakdown_table
from meshplan.cli.flags import ClusterFlags, ModelFlags, TrainingFlags, with_flags
from meshplan.cli.main import app
from meshplan.cli.plan_flags import PlanFlags, build_plan, plan_argv
from meshplan.numbers import check_count
from meshplan.plan import Job
from meshplan.targets import Target, plan_target

PLAN_FILE_GIVES = ("model", "override", "cluster", "gpu", "nodes", "gpus", "gpus_per_node", "seq_len", "global_batch",
                   "global_batch_tokens", "precision", "recipe", "optimizer", "dp", "dp_shard", "tp", "pp", "cp",
                   "ep", "zero", "micro_batch", "recompute", "schedule", "vpp", "sp", "cp_method", "stage_layers",
                   "recompute_layers", "expert_placement", "expert_replicas")
"""Flags a ``--plan`` Job file already answers: typing one with it is an error, not an override
(to change a plan, estimate it with flags, or write a new Job with ``meshplan plan --out``).
``--expert-skew`` / ``--expert-load`` describe the data, not the plan: they replace the file's."""


@app.command("estimate")
@with_flags(model_flags=ModelFlags, cluster_flags=ClusterFlags, training_flags=TrainingFlags,
            plan_flags=PlanFlags)
def estimate_cmd(
    ctx: typer.Context,
    model_flags: ModelFlags,
    cluster_flags: ClusterFlags,
    training_flags: TrainingFlags,
    plan_flags: PlanFlags,
    plan_file: Annotated[Optional[str], typer.Option("--plan", help="A plan JSON (Job file) instead of the flags above (which are then refused; --cluster-profile applies).")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="Total GPUs (instead of --nodes, as `plan --gpus`).")] = None,
    cluster_profile: ClusterProfileOpt = None,
    target: Annotated[Optional[Target], typer.Option("--target", help="The stack that runs the plan: its calibration (overlap, host costs, fitted efficiencies); given, a warning (stderr) when it cannot run the plan. Default: the one --plan's file was planned for, else meshplan.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Estimate step time, throughput, MFU and memory of one parallel plan."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cost import estimate
    from meshplan.cost.data_aware import data_aware_steps
    from meshplan.cost.expert_gain import placement_options, uniform_step_time_s
    from meshplan.search.memory_margin import job_memory_error, memory_margin

    given_target = target
    if plan_file is not None:
        refuse_with(ctx, PLAN_FILE_GIVES, because="--plan brings its own model, cluster, batch and plan")
        job = Job.load(plan_file)
        target = plan_target(target, job.target)  # the stack the file was planned for
        spec, train, base, plan = job.model, job.training, job.cluster, job.plan
        train = replace(train, expert_load=training_flags.expert_load_spec(train.expert_load))
        train = training_flags.with_data(train)  # the data flags apply to a Job's training
    else:
        spec = model_flags.spec(missing="name a model with --model (or give --plan plan.json)")
        base = cluster_flags.spec(gpus=None if gpus is None else check_count("--gpus", gpus))
        train = training_flags.spec()
        needs(ctx, "schedule", plan_flags.pp > 1, without="--pp > 1 (it orders the pipeline's micro-batches)")
        needs(ctx, "cp_method", plan_flags.cp > 1, without="--cp > 1 (it is how context-parallel attention is split)")
        plan = build_plan(base.num_gpus, plan_flags)
    target = target or Target.MESHPLAN
    hw = resolve_hardware(base, train.precision, cluster_profile, target.value)
    clus = hw.cluster
    est = estimate(spec, clus, train, plan, hw.calib)
    margin = memory_margin(est, est.gpu_memory_gib, job_memory_error(spec, train, clus))
    data = data_aware_steps(spec, clus, train, plan, hw.calib)
    options = placement_options(spec, clus, train, plan, hw.calib)
    uniform_s = uniform_step_time_s(spec, clus, train, plan, hw.calib) if est.expert_load else None
    refused = warn_if_refused(target if given_target is not None or target != Target.MESHPLAN else None,
                              spec, train, plan)
    if json_out:
        out = est.to_dict()
        out["target_refuses"] = refused
        out["memory_margin"] = margin.to_dict()
        out["flags"] = plan_argv(plan)
        out["model"] = spec.name
        out["cluster"] = {"name": clus.name, "gpu": clus.gpu.name, "num_gpus": clus.num_gpus}
        out["target"] = target.value
        out["calibration_source"] = hw.calib.source
        out["expert_placements"] = [{**asdict(o), "placement": o.placement.value} for o in options]
        out["uniform_routing_step_time_s"] = uniform_s
        if data is not None:
            out["data_aware"] = data.to_dict()
        print_json(out)
        return
    _render(est, spec.name, clus, margin)
    if est.expert_load is not None:
        console().print(expert_load_table(est, train.expert_load.describe(), options, uniform_s))
    if data is not None:
        console().print(data_aware_table(data, train))


def warn_if_refused(target: Target | None, spec, training, plan) -> str | None:
    """One warning line on stderr when ``target`` cannot run ``plan`` (targets.why_not); the reason."""
    from meshplan.targets import why_not

    if target is None:
        return None
    reason = why_not(target, spec, training, plan)
    if reason is not None:
        err_console().print(f"[yellow]warning:[/yellow] {target.value} cannot run this plan: {reason}",
                            markup=True, highlight=False, soft_wrap=True)
    return reason


def _render(est, model_name: str, clus, margin) -> None:
    con = console()
    s = Table(title=f"{model_name} on {clus.num_gpus} x {clus.gpu.name}: {est.plan.notation()}")
    s.add_column("metric")
    s.add_column("value", justify="right")
    fit = "yes" if est.fits else f"[red]NO, short by {est.memory_shortfall_gib:.1f} GiB[/red]"
    if not est.fits and est.memory_shortfall_gib == 0:
        fit = "[red]NO, the offloaded tensors overflow host memory[/red]"
    for k, v in (("step time", f"{est.step_time_s:.3f} s"), ("tokens/s", f"{est.tokens_per_s:,.0f}"),
                 ("tokens/s per GPU", f"{est.tokens_per_s_per_gpu:,.0f}"),
                 ("model TFLOP/s per GPU", f"{est.tflops_per_gpu:.1f}"), ("MFU", f"{est.mfu:.1%}"),
                 ("peak memory reserved", f"{est.peak_memory_gib:.1f} / {est.gpu_memory_gib:.1f} GiB"),
                 ("peak memory allocated", f"{est.peak_allocated_gib:.1f} GiB"),
                 ("peak on the device (+ CUDA context, NCCL)", f"{est.peak_device_gib:.1f} GiB"),
                 ("must fit (held peak + CUDA context, NCCL)",
                  f"{est.fit_memory_gib:.1f} / {est.gpu_memory_gib:.1f} GiB"),
                 ("fits", fit),
                 (f"must fit + {margin.memory_error:.1%} p90 memory error (class {margin.error_class})",
                  f"{margin.with_headroom_gib:.1f} / {est.gpu_memory_gib:.1f} GiB"
                  + ("" if margin.keeps_headroom else " [yellow](less headroom than the error asks)[/yellow]")),
                 ("micro-batches", str(est.time.num_microbatches))):
        s.add_row(k, v)
    if est.plan.offload:
        over = est.host_memory_gib > est.host_memory_budget_gib
        s.add_row("host memory (offload)", f"{'[red]' if over else ''}{est.host_memory_gib:.1f} / "
                  f"{est.host_memory_budget_gib:.1f} GiB{' over' if over else ''}{'[/red]' if over else ''}")
    con.print(s)
    con.print(time_breakdown_table(est, "Step time breakdown (critical path)"))
    m = Table(title="Memory of the most loaded GPU (GiB)")
    m.add_column("part")
    m.add_column("GiB", justify="right")
    for k, v in est.memory.gib().items():
        m.add_row(k, f"{v:.2f}")
    for k, v in osdp_memory_rows(est):
        m.add_row(k, f"{v:.2f}")
    con.print(m)
    if len(est.stages) > 1:
        st = Table(title="Per pipeline rank")
        for col in ("rank", "layers", "recomputed", "in-flight mb", "time/mb s", "memory GiB"):
            st.add_column(col, justify="right")
        for sc in est.stages:
            st.add_row(str(sc.rank), str(sc.layers), str(sc.recomputed_layers),
                       f"{sc.in_flight_microbatches:.2f}", f"{sc.microbatch_time_s:.4f}",
                       f"{sc.memory.total_bytes / 2**30:.1f}")
        con.print(st)
