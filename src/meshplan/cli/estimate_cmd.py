"""`meshplan estimate`: the cost of one parallel plan, as tables or one JSON object."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import (
    ClusterOpt, ClusterProfileOpt, GlobalBatchOpt, GlobalBatchTokensOpt, GpuOpt, GpusPerNodeOpt,
    JsonOpt, ModelOpt, NodesOpt, OptimizerOpt, OverrideOpt, PrecisionOpt, SeqLenOpt, console,
    load_cluster, load_model, make_training, print_json,
)
from meshplan.cli.checks import needs, refuse_with
from meshplan.cli.cost_tables import time_breakdown_table
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, Job, ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.training import Optimizer, Precision

Int = Optional[int]

PLAN_FILE_GIVES = ("model", "override", "cluster", "gpu", "nodes", "gpus_per_node", "seq_len", "global_batch",
                   "global_batch_tokens", "precision", "optimizer", "dp", "dp_shard", "tp", "pp", "cp", "ep",
                   "zero", "micro_batch", "recompute", "schedule", "vpp", "sp", "cp_method")
"""Flags a ``--plan`` Job file already answers: typing one with it is an error, not an override
(to change a plan, estimate it with flags, or write a new Job with ``meshplan plan --out``)."""


def build_plan(*, num_gpus: int, dp: int | None, dp_shard: int | None, tp: int, pp: int, cp: int,
               ep: int, zero: int, micro_batch: int, recompute: Recompute, schedule: Schedule,
               vpp: int, sp: bool | None, cp_method: CPMethod) -> Plan:
    """Plan from CLI flags. ``dp`` is the total data-parallel degree (derived from the GPU count
    when left out); with ``zero > 0`` it is sharded (``dp_shard = dp``) unless ``dp_shard`` is
    given, in which case ``dp_replicate = dp / dp_shard`` (HSDP)."""
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp),
                    ("micro-batch", micro_batch), ("dp", dp), ("dp-shard", dp_shard)):
        if v is not None and v < 1:
            raise MeshplanError(f"--{name} must be a positive integer, got {v}")
    model_par = tp * pp * cp
    if dp is None:
        if num_gpus % model_par:
            raise MeshplanError(f"{num_gpus} GPUs are not divisible by tp*pp*cp = {model_par}")
        dp = num_gpus // model_par
    if dp_shard is None:
        dp_shard = dp if zero > 0 else 1
    if dp % dp_shard:
        raise MeshplanError(f"--dp {dp} is not divisible by --dp-shard {dp_shard}")
    if schedule == Schedule.ONE_F_ONE_B and vpp > 1:
        schedule = Schedule.INTERLEAVED_1F1B
    return Plan(
        dims=ParallelDims(dp_replicate=dp // dp_shard, dp_shard=dp_shard, tp=tp, pp=pp, cp=cp, ep=ep),
        zero=zero, sp=(tp > 1) if sp is None else sp, schedule=schedule, vpp=vpp,
        cp_method=cp_method, micro_batch=micro_batch, recompute=recompute,
    )


@app.command("estimate")
def estimate_cmd(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Preset name or a Hugging Face config.json path.")] = None,
    override: OverrideOpt = None,
    cluster: ClusterOpt = None,
    gpu: GpuOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Sequence length in tokens.")] = 2048,
    global_batch: GlobalBatchOpt = None,
    global_batch_tokens: GlobalBatchTokensOpt = None,
    precision: PrecisionOpt = Precision.BF16,
    optimizer: OptimizerOpt = Optimizer.ADAMW,
    dp: Annotated[Int, typer.Option("--dp", help="Data-parallel degree (default: GPUs / (tp*pp*cp)).")] = None,
    dp_shard: Annotated[Int, typer.Option("--dp-shard", help="Sharded part of --dp (HSDP); default all of it when --zero > 0.")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")] = 1,
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage over the sharded data-parallel ranks (3 = FSDP).")] = 0,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1,
    recompute: Annotated[Recompute, typer.Option("--recompute", help="Activation recomputation.")] = Recompute.NONE,
    schedule: Annotated[Schedule, typer.Option("--schedule", help="Pipeline schedule.")] = Schedule.ONE_F_ONE_B,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per rank (implies --schedule interleaved-1f1b when 1f1b).")] = 1,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallel (default: on when tp > 1).")] = None,
    cp_method: Annotated[CPMethod, typer.Option("--cp-method", help="Context-parallel attention.")] = CPMethod.RING,
    plan_file: Annotated[Optional[str], typer.Option("--plan", help="A plan JSON (Job file) instead of the flags above (which are then refused; --cluster-profile applies).")] = None,
    cluster_profile: ClusterProfileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Estimate step time, throughput, MFU and memory of one parallel plan."""
    from meshplan.cost import estimate

    if plan_file is not None:
        refuse_with(ctx, PLAN_FILE_GIVES, because="--plan brings its own model, cluster, batch and plan")
        job = Job.load(plan_file)
        spec, train, clus, plan = job.model, job.training, job.cluster, job.plan
    else:
        if model is None:
            raise MeshplanError("name a model with --model (or give --plan plan.json)")
        spec = load_model(model, override)
        clus = load_cluster(cluster, gpu, nodes, gpus_per_node, profile=cluster_profile)
        train = make_training(seq_len, global_batch, global_batch_tokens, precision, optimizer)
        needs(ctx, "schedule", pp > 1, without="--pp > 1 (it orders the pipeline's micro-batches)")
        needs(ctx, "cp_method", cp > 1, without="--cp > 1 (it is how context-parallel attention is split)")
        plan = build_plan(num_gpus=clus.num_gpus, dp=dp, dp_shard=dp_shard, tp=tp, pp=pp, cp=cp,
                          ep=ep, zero=zero, micro_batch=micro_batch, recompute=recompute,
                          schedule=schedule, vpp=vpp, sp=sp, cp_method=cp_method)
    calib = None
    if cluster_profile:  # the measured rates came with apply_profile; the factors come from the same file
        from meshplan.spec.hwcalib import profile_calibration

        calib = profile_calibration(cluster_profile, clus.gpu, train.precision, clus.num_gpus)
    est = estimate(spec, clus, train, plan, calib)
    if json_out:
        out = est.to_dict()
        out["model"] = spec.name
        out["cluster"] = {"name": clus.name, "gpu": clus.gpu.name, "num_gpus": clus.num_gpus}
        print_json(out)
        return
    _render(est, spec.name, clus)


def _render(est, model_name: str, clus) -> None:
    con = console()
    s = Table(title=f"{model_name} on {clus.num_gpus} x {clus.gpu.name}: {est.plan.notation()}")
    s.add_column("metric")
    s.add_column("value", justify="right")
    fit = "yes" if est.fits else f"[red]NO, short by {est.memory_shortfall_gib:.1f} GiB[/red]"
    for k, v in (("step time", f"{est.step_time_s:.3f} s"), ("tokens/s", f"{est.tokens_per_s:,.0f}"),
                 ("tokens/s per GPU", f"{est.tokens_per_s_per_gpu:,.0f}"),
                 ("model TFLOP/s per GPU", f"{est.tflops_per_gpu:.1f}"), ("MFU", f"{est.mfu:.1%}"),
                 ("peak memory", f"{est.peak_memory_gib:.1f} / {est.gpu_memory_gib:.1f} GiB"),
                 ("fits", fit), ("micro-batches", str(est.time.num_microbatches))):
        s.add_row(k, v)
    con.print(s)
    con.print(time_breakdown_table(est, "Step time breakdown (critical path)"))
    m = Table(title="Memory of the most loaded GPU (GiB)")
    m.add_column("part")
    m.add_column("GiB", justify="right")
    for k, v in est.memory.gib().items():
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
