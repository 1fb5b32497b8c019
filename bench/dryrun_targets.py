"""The four real-size dry runs of issue 16.

``python bench/dryrun_targets.py OUTDIR`` writes them as Job files (then ``meshplan train --plan
OUTDIR/<name>.json --dry-run`` prints each rank's layout, ``--dry-run --simulate`` runs one); ``--run [NAME ...]`` also dry-runs the first and last rank
of each (two steps; ``--one-step`` for one), prints the side-by-side tables and saves every result
under OUTDIR/results.json.
1. llama3-70b on 1024 H100s: tp8 (sp) pp4 with 5 virtual stages per rank (interleaved 1F1B), FSDP over 32.
2. llama3.1-405b on 16384 H100s: the Llama 3 paper's 8k-context layout (Dubey et al. 2024, Table 4):
   tp8 pp16 dp128, 16M-token batch.
3. mixtral-8x22b on 256 H100s: expert parallel 8 over the 64 FSDP ranks, pp4.
4. llama3-8b at 128K context on 128 H100s: tp8 cp16 (ring attention), one sequence per step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshplan.plan import CPMethod, Job, ParallelDims, Plan, Schedule
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def target_jobs() -> dict[str, Job]:
    def job(model: str, gpus: int, seq: int, batch: int, plan: Plan) -> Job:
        j = Job(model=model_preset(model), training=TrainingSpec(seq_len=seq, global_batch=batch),
                cluster=resolve_cluster("dgx-h100", gpus=gpus), plan=plan)
        j.plan.validate_for(j.model, j.training, gpus)
        return j

    return {
        "llama3-70b_1024": job("llama3-70b", 1024, 8192, 256, Plan(
            dims=ParallelDims(tp=8, pp=4, dp_shard=32), zero=1, sp=True,
            schedule=Schedule.INTERLEAVED_1F1B, vpp=5)),
        "llama3.1-405b_16384": job("llama3.1-405b", 16384, 8192, 2048, Plan(
            dims=ParallelDims(tp=8, pp=16, dp_shard=128), zero=1, sp=True)),
        "mixtral-8x22b_ep": job("mixtral-8x22b", 256, 4096, 256, Plan(
            dims=ParallelDims(pp=4, dp_shard=64, ep=8), zero=3)),
        "llama3-8b_cp128k": job("llama3-8b", 128, 131072, 1, Plan(
            dims=ParallelDims(tp=8, cp=16), zero=3, sp=True, cp_method=CPMethod.RING)),
    }


def main(argv: list[str]) -> None:
    import json
    import time

    from rich.console import Console

    from meshplan.report.dryrun import compare, render
    from meshplan.runtime.dryrun_launch import parse_ranks, run_ranks

    out = Path(argv[0] if argv else "dryrun_targets")
    out.mkdir(parents=True, exist_ok=True)
    run = "--run" in argv
    steps = 1 if "--one-step" in argv else 2
    names = [a for a in argv[1:] if not a.startswith("--")]
    jobs = target_jobs()
    results_path = out / "results.json"
    saved = json.loads(results_path.read_text()) if results_path.exists() else {}
    console = Console(width=110)
    for name, j in jobs.items():
        j.save(out / f"{name}.json")
        if not run or (names and name not in names):
            continue
        start = time.perf_counter()
        results = run_ranks(j, parse_ranks("first,last", j), steps=steps)
        comparisons = compare(j, results)
        saved[name] = {"wall_s": time.perf_counter() - start, "steps": steps,
                       "ranks": [c.to_dict() for c in comparisons]}
        results_path.write_text(json.dumps(saved, indent=1))
        console.print(render(j, comparisons))
        console.print(f"{name}: {time.perf_counter() - start:.0f} s for {len(results)} ranks")


if __name__ == "__main__":
    main(sys.argv[1:])
