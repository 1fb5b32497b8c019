"""`meshplan train --dry-run`: what each rank of a plan would build (mesh groups, stages, shards,
memory against the cost model), at once and without torch; with ``--simulate``, chosen ranks also
run two training steps on torch's fake process group and fake tensors (runtime/dryrun.py, one
worker process per rank)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from meshplan.cli.common import console, print_json
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.spec.cluster import GIB

DRY_RUN_STEPS = 2
"""Training steps per simulated rank: the first creates the optimizer states after its backward, so
only from the second on do they coexist with the activations (the steady-state peak); collectives
are counted over the last step."""
MAX_LISTED_RANKS = 4096
"""Ranks one layout lists (``--ranks all`` of a larger world is refused: name the ranks instead)."""
MAX_SIMULATED_RANKS = 16
"""Ranks one ``--simulate`` runs: each takes 2 to 6 minutes on a 2-core CPU (docs/dryrun.md, "Real
sizes on this CPU": 117 to 371 s per rank), so 16 is already about an hour."""


def check_simulation(job: Job, ranks: list[int]) -> None:
    """Refuse, before any worker starts, what a simulation could not finish (the runtime's own
    limits, support.check_runnable, come first: the layer count among them)."""
    if len(ranks) > MAX_SIMULATED_RANKS:
        raise MeshplanError(f"--simulate runs one process of minutes per rank; {len(ranks):,} ranks is more than "
                            f"{MAX_SIMULATED_RANKS} (name a few with --ranks, e.g. first,last)")


def dry_run(job: Job, ranks_spec: str, json_out: bool, *, simulate: bool = False,
            cluster_profile: str | None = None, text_data: bool = False) -> None:
    """The layout of the chosen ranks, or (``simulate``) their simulated steps. A plan meshplan's
    runtime refuses is refused by a simulation; its layout is still printed, with the refusal."""
    from meshplan.runtime.dryrun_launch import parse_ranks
    from meshplan.runtime.support import check_runnable

    ranks = parse_ranks(ranks_spec, job)
    if simulate:
        check_runnable(job, text_data=text_data)
        check_simulation(job, ranks)
        _simulate(job, ranks, json_out)
        return
    if len(ranks) > MAX_LISTED_RANKS:
        raise MeshplanError(f"--ranks {ranks_spec}: {len(ranks):,} ranks is more than the {MAX_LISTED_RANKS:,} a "
                            "layout lists; name the ranks (e.g. first,last or 0,8,1023)")
    try:
        check_runnable(job, text_data=text_data)
        refusal = None
    except MeshplanError as exc:
        refusal = str(exc)
    _layout(job, ranks, json_out, cluster_profile, refusal)


def _layout(job: Job, ranks: list[int], json_out: bool, cluster_profile: str | None, refusal: str | None) -> None:
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.runtime.dryrun_layout import layout

    hw = resolve_hardware(job.cluster, job.training.precision, cluster_profile, "meshplan")
    job = Job(model=job.model, training=job.training, cluster=hw.cluster, plan=job.plan)
    est, builds = layout(job, ranks, hw.calib)
    if json_out:
        print_json({"model": job.model.name, "plan": job.full_plan.notation(), "mode": "layout",
                    "world_size": job.plan.dims.world_size, "gpu_memory_gib": est.gpu_memory_gib,
                    "fit_memory_gib": est.fit_memory_gib, "fits": est.fits,
                    "calibration_source": hw.calib.source, "runtime_refuses": refusal,
                    "ranks": [b.to_dict() for b in builds]})
        return
    console().print(_render_layout(job, est, builds))
    if refusal:
        console().print(f"[yellow]meshplan's runtime cannot train this plan ({refusal}): this is the layout "
                        "a stack that runs it would place; --simulate is refused[/yellow]")


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def _render_layout(job: Job, est, builds) -> Group:
    plan = job.full_plan
    title = (f"meshplan train --dry-run: {job.model.name}  {plan.notation()}  world {plan.dims.world_size:,}  "
             f"(layout: nothing built; --simulate runs the steps)")
    t = Table(title=title)
    for col in ("rank", "pp", "stages: layers", "params held", "weight shards GiB layout / model", "grads GiB",
                "optimizer GiB", "activations GiB", "other GiB", "reserved GiB", f"reserved vs {est.gpu_memory_gib:.1f} GiB"):
        t.add_column(col, justify="right")
    for b in builds:
        m = b.model_memory
        stages = "; ".join(f"{s.stage}: {s.layers_text()}" + ("+E" if s.embedding else "") + ("+H" if s.head else "")
                           + (f"+{s.mtp_modules}mtp" if s.mtp_modules else "") for s in b.stages)
        t.add_row(str(b.rank), str(b.coords["pp"]), stages, f"{b.held_params / 1e9:,.3f} B",
                  f"{_gib(b.layout_weight_bytes)}{' (host)' if b.weights_on_host else ''} / {_gib(m['weight_shard_bytes'])}", _gib(m["gradients_bytes"]),
                  _gib(m["optimizer_bytes"]), _gib(m["activations_bytes"]), _gib(m["other_bytes"]),
                  _gib(m["total_bytes"]), "within" if b.fits else "[red]over[/red]")
    g = Table(title="mesh groups per rank (torch.arange(world).view(pp, dp_replicate, dp_shard, cp, tp))")
    for col in ("rank", "axis", "size", "index", "ranks"):
        g.add_column(col, justify="right")
    for b in builds:
        for grp in b.groups:
            if grp.size > 1:
                g.add_row(str(b.rank), grp.axis, str(grp.size), str(grp.index), grp.ranks_text())
    verdict = "fits" if est.fits else "[red]does not fit[/red]"
    fit = (f"estimate: the plan needs {est.fit_memory_gib:.2f} GiB per GPU to fit (the busiest rank's held peak + "
           f"CUDA context + NCCL; meshplan estimate's fit_memory_gib) of {est.gpu_memory_gib:.1f} GiB: {verdict}")
    note = ("[dim]E: embedding, H: final norm + head + loss. Memory: the cost model's figure for the rank's "
            "pipeline stage (meshplan estimate --plan); 'weights layout' counts the stage's parameters as the "
            "runtime splits them (tp, ep x etp, ZeRO-3 over dp_shard x cp), next to the model's weights less OSDP's "
            "groups kept gathered.[/dim]")
    return Group(t, fit, g, note)


def _simulate(job: Job, ranks: list[int], json_out: bool) -> None:
    from meshplan.report.dryrun import compare, render
    from meshplan.runtime.dryrun_launch import run_ranks

    if not json_out:
        console().print(f"[dim]dry run of rank(s) {', '.join(map(str, ranks))} of "
                        f"{job.plan.dims.world_size}, one process each[/dim]")
    comparisons = compare(job, run_ranks(job, ranks, steps=DRY_RUN_STEPS))
    if json_out:
        print_json({"model": job.model.name, "plan": job.full_plan.notation(), "mode": "simulate",
                    "world_size": job.plan.dims.world_size, "ranks": [c.to_dict() for c in comparisons]})
        return
    console().print(render(job, comparisons))
