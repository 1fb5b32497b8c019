"""Train one tiny model with every pipeline schedule and print loss and speed side by side.

    PYTHONPATH=src python bench/pipeline_schedules.py [--ranks 2|4] [--steps 20] [--data FILE]

Same model, data, seed and batch for every schedule, so the loss columns must agree (the schedules
change the order of work, not the math); step time and tokens/s show the schedules' overheads on
this machine (on CPU processes they measure Python and gloo overheads, not GPU bubbles).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import TrainingSpec

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=4, choices=(2, 4), help="2: pp2; 4: pp2 x dp2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--data", default=None, help="text file (default: synthetic tokens)")
    ap.add_argument("--model", default="toy-llama")
    args = ap.parse_args()
    dp = args.ranks // 2
    training = TrainingSpec(seq_len=64, global_batch=8 * dp)
    table = Table(title=f"{args.model}, pp2 x dp{dp}, {args.steps} steps, batch {training.global_batch}x{training.seq_len}")
    for col in ("schedule", "first loss", "final loss", "step s", "tokens/s", "peak GiB"):
        table.add_column(col, justify="right")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        for schedule, vpp in SCHEDULES:
            plan = Plan(dims=ParallelDims(pp=2, dp_replicate=dp), schedule=schedule, vpp=vpp, micro_batch=2)
            job = Job(model=resolve_model(args.model, {}), training=training,
                      cluster=resolve_cluster("cpu", gpus=args.ranks), plan=plan)
            path = Path(tmp) / f"{schedule}.json"
            job.save(path)
            cmd = [sys.executable, "-m", "meshplan", "train", "--plan", str(path), "--steps", str(args.steps),
                   "--lr", "3e-3", "--json"] + (["--data", args.data] if args.data else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error:" in ln]
                Console(stderr=True).print(f"{schedule} failed:", *errors[:5], sep="\n")
                table.add_row(schedule, "failed", "", "", "", "")
                continue
            s = json.loads(proc.stdout)
            table.add_row(f"{schedule}" + (f" v{vpp}" if vpp > 1 else ""), f"{s['first_loss']:.4f}",
                          f"{s['final_loss']:.4f}", f"{s['mean_step_time_s']:.3f}",
                          f"{s['mean_tokens_per_s']:,.0f}", f"{s['peak_memory_gib']:.3f}")
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
