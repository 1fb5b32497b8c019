"""`meshplan replan`: plan a checkpointed run for a new GPU count and say how to continue it.

Reads only the checkpoint's meshplan metadata (no torch): the model, training spec and plan the
run was made with. Keeps the model and the batch, searches the best plan for ``--gpus M`` with the
same search as ``meshplan plan``, writes it as a Job file, and prints the ``meshplan train --resume``
command that continues the run under it (DCP reshards the checkpoint on load).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from meshplan import ckpt_meta
from meshplan.cli.common import ClusterOpt, ClusterProfileOpt, GpusPerNodeOpt, JsonOpt, MemoryGibOpt, console, load_cluster, print_json, path_value
from meshplan.cli.checks import count_flag, memory_budget_gib, output_path
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.spec.cluster import GIB, ClusterSpec, system_names, system_preset


def new_cluster(saved: ClusterSpec, gpus: int, cluster: str | None, gpus_per_node: int | None) -> ClusterSpec:
    """``--cluster`` resized to ``gpus``; without it, the checkpoint's own hardware resized."""
    if cluster is not None:
        return load_cluster(cluster, None, None, gpus_per_node, gpus=gpus)
    # A saved cluster was already cut to the old GPU count (e.g. 2 of a node's 4): start again from
    # its preset's node size when it is one, so 8 GPUs become 2 full nodes, not 4 half ones.
    base = system_preset(saved.name) if saved.name in system_names() else saved
    if gpus_per_node is not None:
        base = base.with_size(gpus_per_node=gpus_per_node)
    return base.with_gpus(gpus)


def pick_runnable(points, old: Job, cluster: ClusterSpec):
    """The fastest frontier point the runtime can run, and the faster ones it skipped (with why)."""
    from meshplan.runtime.support import check_runnable

    skipped = []
    for p in points:
        try:
            job = Job(model=old.model, training=old.training, cluster=cluster, plan=p.plan)
            check_runnable(job)
        except MeshplanError as exc:
            skipped.append((p.plan, str(exc)))
            continue
        return p, skipped
    return None, skipped


def resume_command(plan_path: Path, checkpoint_root: Path) -> str:
    return " ".join(["meshplan", "train", "--plan", shlex.quote(str(plan_path)), "--resume",
                     "--checkpoint-dir", shlex.quote(str(checkpoint_root))])


@app.command("replan")
def replan(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", parser=path_value, help="A checkpoint directory (or a --checkpoint-dir root: its latest complete checkpoint).")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPU count to continue on.")],
    cluster: ClusterOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    memory_gib: MemoryGibOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=path_value, help="Where to write the new plan (a Job file).")] = Path("replan.json"),
    cluster_profile: ClusterProfileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Plan a checkpointed run for a new GPU count; print the command that resumes it."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.search.planner import search

    count_flag("--gpus", gpus)
    output_path(out, "--out", "plan file")
    ckpt, meta = ckpt_meta.load_meta(checkpoint)
    old = meta.job
    hw = resolve_hardware(new_cluster(old.cluster, gpus, cluster, gpus_per_node), old.training.precision,
                          cluster_profile)
    cl = hw.cluster
    memory_budget_gib(memory_gib, cl.gpu)
    result = search(old.model, cl, old.training, calib=hw.calib,
                    budget_bytes=None if memory_gib is None else memory_gib * GIB)
    best, skipped = pick_runnable(result.fitting, old, cl)
    if best is None and skipped:
        raise MeshplanError(f"no plan that fits on {gpus} {cl.gpu.name} can be run by this runtime "
                            f"(fastest: {skipped[0][0].notation()}: {skipped[0][1]})")
    if best is None:
        need = result.min_memory_bytes / GIB
        raise MeshplanError(
            f"no plan for {old.model.name} fits {result.budget_bytes / GIB:.1f} GiB per GPU on {gpus} "
            f"{cl.gpu.name}; the leanest needs {need:.1f} GiB (try more GPUs or --memory-gib)"
        )
    job = Job(model=old.model, training=old.training, cluster=cl, plan=best.plan)
    try:
        job.save(out)
    except OSError as exc:
        raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None
    root = ckpt.parent
    command = resume_command(out, root)
    latest = ckpt_meta.latest_checkpoint(root)
    if json_out:
        print_json({
            "checkpoint": str(ckpt), "step": meta.step,
            "old": {"num_gpus": meta.world_size, "plan": old.plan.notation()},
            "new": {"num_gpus": gpus, "plan": best.plan.notation(), "step_time_s": best.step_time_s,
                    "peak_memory_gib": best.peak_memory_gib, "fit_memory_gib": best.fit_memory_gib},
            "plan_file": str(out), "command": command,
            "skipped_unrunnable": [{"plan": p.notation(), "reason": why} for p, why in skipped],
            "resumes_from_latest": latest == ckpt,
        })
        return
    con = console()
    con.print(f"checkpoint {ckpt} (step {meta.step}): {old.model.name}, "
              f"{old.plan.notation()} on {meta.world_size} {old.cluster.gpu.name}")
    con.print(f"new plan for {gpus} {cl.gpu.name}: {best.plan.notation()}  "
              f"(est. {best.step_time_s:.3g} s/step, {best.peak_memory_gib:.1f} GiB/GPU)")
    for p, why in skipped:
        con.print(f"skipped the faster {p.notation()}: {why}")
    con.print(f"wrote {out}")
    if latest != ckpt:
        con.print(f"note: --resume takes the latest checkpoint in {root} ({latest.name}), not {ckpt.name}")
    # a checkpoint records the model, plan and data position, not the data, steps or learning
    # rate: the command alone would resume on random tokens at the default --lr
    con.print("continue with (add the --steps, --data and --lr of the run it resumes: a checkpoint does not "
              "record them):", soft_wrap=True)
    con.print(command, soft_wrap=True, markup=False)
