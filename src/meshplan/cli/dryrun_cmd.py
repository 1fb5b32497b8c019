"""`meshplan train --dry-run`: simulate ranks of a plan on torch's fake process group and print each
next to the cost model (the runtime side is meshplan.runtime.dryrun; torch only in the workers)."""

from __future__ import annotations

from meshplan.cli.common import console, print_json
from meshplan.plan import Job

DRY_RUN_STEPS = 2
"""Training steps per simulated rank: the first creates the optimizer states after its backward, so
only from the second on do they coexist with the activations (the steady-state peak); collectives
are counted over the last step."""


def dry_run(job: Job, ranks_spec: str, json_out: bool) -> None:
    from meshplan.report.dryrun import compare, render
    from meshplan.runtime.dryrun_launch import parse_ranks, run_ranks

    ranks = parse_ranks(ranks_spec, job)
    if not json_out:
        console().print(f"[dim]dry run of rank(s) {', '.join(map(str, ranks))} of "
                        f"{job.plan.dims.world_size}, one process each[/dim]")
    comparisons = compare(job, run_ranks(job, ranks, steps=DRY_RUN_STEPS))
    if json_out:
        print_json({"model": job.model.name, "plan": job.full_plan.notation(),
                    "world_size": job.plan.dims.world_size, "ranks": [c.to_dict() for c in comparisons]})
        return
    console().print(render(job, comparisons))
