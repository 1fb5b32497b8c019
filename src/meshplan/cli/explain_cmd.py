"""`meshplan explain plan.json`: a Job's full cost breakdown, per pipeline stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from meshplan.cli.common import ClusterProfileOpt, JsonOpt, console, print_json, path_value
from meshplan.cli.cost_tables import time_breakdown_table
from meshplan.cli.main import app
from meshplan.cli.plan_flags import plan_argv
from meshplan.plan import Job
from meshplan.targets import plan_target


@app.command("explain")
def explain_cmd(
    plan_file: Annotated[Path, typer.Argument(parser=path_value, help="A Job file written by `meshplan plan --out`.")],
    cluster_profile: ClusterProfileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print a plan's step time, memory and per-stage breakdown under the cost model."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cost import estimate

    job = Job.load(plan_file)
    target = plan_target(None, job.target)  # the stack the file was planned for: its step time
    hw = resolve_hardware(job.cluster, job.training.precision, cluster_profile, target.value)
    est = estimate(job.model, hw.cluster, job.training, job.plan, hw.calib)
    plan = est.plan
    if json_out:
        out = est.to_dict()
        out["job"] = {"model": job.model.name, "cluster": job.cluster.name,
                      "num_gpus": job.cluster.num_gpus, "seq_len": job.training.seq_len,
                      "global_batch": job.training.global_batch,
                      "precision": job.training.precision.value, "plan": plan.to_dict(),
                      "target": target.value,
                      "flags": plan_argv(job.plan)}
        out["calibration_source"] = hw.calib.source
        out["attention_efficiency"] = hw.calib.attention_efficiency
        print_json(out)
        return
    con = console()
    con.print(f"[bold]{plan.notation()}[/]  {job.model.name} on {job.cluster.num_gpus} x "
              f"{job.cluster.gpu.name} ({job.cluster.name}), seq {job.training.seq_len}, "
              f"global batch {job.training.global_batch}, {job.training.precision.value}")
    s = Table(title="Step")
    for col in ("step s", "tokens/s", "tok/s/GPU", "TFLOP/s/GPU", "MFU", "peak GiB", "GPU GiB", "fits"):
        s.add_column(col, justify="right")
    s.add_row(f"{est.step_time_s:.3f}", f"{est.tokens_per_s:,.0f}", f"{est.tokens_per_s_per_gpu:,.0f}",
              f"{est.tflops_per_gpu:.0f}", f"{100 * est.mfu:.1f}%", f"{est.peak_memory_gib:.1f}",
              f"{est.gpu_memory_gib:.1f}", "yes" if est.fits else f"no (short {est.memory_shortfall_gib:.1f} GiB)")
    con.print(s)
    # which calibration applied, the attention efficiency's source among them (kernel table or fit)
    con.print(f"calibration: {hw.calib.source}; attention efficiency {hw.calib.attention_efficiency:g}",
              style="dim", markup=False)
    con.print(time_breakdown_table(est, f"Time per step ({est.time.num_microbatches} micro-batches)"))
    m = Table(title="Memory of the most loaded GPU (GiB)")
    for col in ("parameters", "gradients", "optimizer", "activations", "other", "allocated",
                "allocator reserve", "reserved"):
        m.add_column(col, justify="right")
    g = est.memory.gib()
    m.add_row(*(f"{g[k]:.2f}" for k in ("parameters", "gradients", "optimizer", "activations", "other")),
              f"{est.memory.allocated_bytes / 2**30:.2f}", f"{g['allocator_reserve']:.2f}",
              f"{est.memory.total_bytes / 2**30:.2f}")
    con.print(m)
    st = Table(title="Per pipeline rank")
    for col in ("rank", "virtual stages", "layers", "recomputed", "in flight", "mb time ms",
                "params", "grads", "optim", "acts", "other", "reserve", "total GiB"):
        st.add_column(col, justify="right")
    for sc in est.stages:
        vs = [i for i in range(plan.num_stages) if plan.stage_rank(i) == sc.rank]
        mg = sc.memory.gib()
        layers = f"{sc.layers}+{sc.mtp_modules} MTP" if sc.mtp_modules else str(sc.layers)
        st.add_row(str(sc.rank), ",".join(map(str, vs)), layers, str(sc.recomputed_layers),
                   f"{sc.in_flight_microbatches:g}", f"{1e3 * sc.microbatch_time_s:.1f}",
                   *(f"{mg[k]:.2f}" for k in ("parameters", "gradients", "optimizer", "activations", "other",
                                              "allocator_reserve")),
                   f"{sc.memory.total_bytes / 2**30:.2f}")
    con.print(st)
