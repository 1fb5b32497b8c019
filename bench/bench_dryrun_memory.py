"""Cost-model peak memory against the dry run's tracked peak, over 25 plans.

``PYTHONPATH=src python bench/bench_dryrun_memory.py [--out bench/results/dryrun_memory.json]``

Real models cut to a few layers (full width, vocabulary and sequence, so every per-layer and
per-token term is at scale) on H100s, plans covering FSDP/ZeRO 0-3, HSDP, tp with and without
sequence parallel, context parallel (ring and all-to-all), pipelines (1F1B, GPipe, interleaved),
recompute (full, selective), MoE with expert parallel, tied embeddings. Each plan: rank 0 and, with
pipeline stages, the last rank; two steps (the second has the optimizer states next to the
activations). Prints per plan the dry-run peak, the cost model's peak for that rank's stage, the
difference, and each side's split; ends with the median absolute difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshplan.plan import CPMethod, Job, ParallelDims, Plan, Recompute, Schedule
from meshplan.report.dryrun import GIB, compare
from meshplan.runtime.dryrun_launch import parse_ranks, run_ranks
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

STEPS = 2


def _job(model: str, layers: int, seq: int, batch: int, gpus: int, **plan) -> Job:
    dims = ParallelDims(**plan.pop("dims"))
    j = Job(model=model_preset(model).with_overrides({"num_layers": layers}),
            training=TrainingSpec(seq_len=seq, global_batch=batch),
            cluster=resolve_cluster(gpu="h100-sxm", gpus=gpus), plan=Plan(dims=dims, **plan))
    j.plan.validate_for(j.model, j.training, gpus)
    return j


def bench_jobs() -> dict[str, Job]:
    L1, S1 = ("llama3.2-1b", 4), 2048
    dense = {
        "fsdp8": dict(dims=dict(dp_shard=8), zero=3),
        "fsdp8-mb2": dict(dims=dict(dp_shard=8), zero=3, micro_batch=2),
        "zero2x8": dict(dims=dict(dp_shard=8), zero=2),
        "zero1x8": dict(dims=dict(dp_shard=8), zero=1),
        "ddp8": dict(dims=dict(dp_replicate=8), zero=0),
        "hsdp2x4": dict(dims=dict(dp_replicate=2, dp_shard=4), zero=3),
        "tp2sp-fsdp4": dict(dims=dict(tp=2, dp_shard=4), zero=3, sp=True),
        "tp4sp-fsdp2": dict(dims=dict(tp=4, dp_shard=2), zero=3, sp=True),
        "tp8sp": dict(dims=dict(tp=8), sp=True),
        "tp2-nosp-fsdp4": dict(dims=dict(tp=2, dp_shard=4), zero=3, sp=False),
        "fsdp8-full": dict(dims=dict(dp_shard=8), zero=3, recompute=Recompute.FULL),
        "fsdp8-selective": dict(dims=dict(dp_shard=8), zero=3, recompute=Recompute.SELECTIVE),
        "cp2ring-fsdp4": dict(dims=dict(cp=2, dp_shard=4), zero=3, cp_method=CPMethod.RING),
        "cp2a2a-fsdp4": dict(dims=dict(cp=2, dp_shard=4), zero=3, cp_method=CPMethod.ALL_TO_ALL),
        "pp2-1f1b-fsdp4": dict(dims=dict(pp=2, dp_shard=4), zero=1),
        "pp2-gpipe-fsdp4": dict(dims=dict(pp=2, dp_shard=4), zero=1, schedule=Schedule.GPIPE),
        "pp2v2-fsdp4": dict(dims=dict(pp=2, dp_shard=4), zero=1, schedule=Schedule.INTERLEAVED_1F1B, vpp=2),
        "pp2-tp2sp-fsdp2": dict(dims=dict(pp=2, tp=2, dp_shard=2), zero=1, sp=True),
    }
    jobs = {f"llama3.2-1b/{k}": _job(*L1, S1, 32, 8, **v) for k, v in dense.items()}
    jobs["llama3-8b/tp8sp"] = _job("llama3-8b", 2, 4096, 8, 8, dims=dict(tp=8), sp=True)
    jobs["llama3-8b/fsdp8-full"] = _job("llama3-8b", 2, 4096, 8, 8, dims=dict(dp_shard=8), zero=3,
                                        recompute=Recompute.FULL)
    moe = ("mixtral-8x7b", 2, 1024, 16, 8)
    jobs["mixtral-8x7b/fsdp8-ep8"] = _job(*moe, dims=dict(dp_shard=8, ep=8), zero=3)
    jobs["mixtral-8x7b/fsdp8-ep4"] = _job(*moe, dims=dict(dp_shard=8, ep=4), zero=3)
    jobs["mixtral-8x7b/pp2-fsdp4-ep4"] = _job(*moe, dims=dict(pp=2, dp_shard=4, ep=4), zero=1)
    jobs["gpt2/fsdp4"] = _job("gpt2", 4, 1024, 16, 4, dims=dict(dp_shard=4), zero=3)
    jobs["gpt2/pp2-fsdp2"] = _job("gpt2", 4, 1024, 16, 4, dims=dict(pp=2, dp_shard=2), zero=1)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/dryrun_memory.json")
    ap.add_argument("--only", nargs="*", help="run only these plan names")
    args = ap.parse_args()
    out = Path(args.out)
    saved = json.loads(out.read_text()) if out.exists() else {}
    console = Console(width=120)
    for name, job in bench_jobs().items():
        if (args.only and name not in args.only) or name in saved:
            continue
        start = time.perf_counter()
        ranks = parse_ranks("first,last" if job.plan.dims.pp > 1 else "first", job)
        rows = [c.to_dict() for c in compare(job, run_ranks(job, ranks, steps=STEPS))]
        saved[name] = {"plan": job.full_plan.notation(), "ranks": rows,
                       "wall_s": time.perf_counter() - start}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(saved, indent=1))
        console.print(f"{name}: {[round(r['peak_difference'], 3) for r in rows]} ({time.perf_counter() - start:.0f} s)")
    console.print(summary_table(saved))


def _with_tensor_bytes(name: str, entry: dict) -> list[dict]:
    """The entry's rows, with the model's tensor figure (report.dryrun.model_tensor_bytes) added
    to rows saved before it existed (compare() again on the saved dry-run results; no torch)."""
    if all("tensor_bytes" in r["cost_model_memory"] for r in entry["ranks"]):
        return entry["ranks"]
    job = bench_jobs()[name]
    return [c.to_dict() for c in compare(job, [r["dry_run"] for r in entry["ranks"]])]


def summary_table(saved: dict) -> Table:
    t = Table(title="cost-model peak vs dry-run tracked peak (GiB per rank)")
    for col in ("plan", "rank", "dry run", "model", "diff", "model tensors", "diff (tensors)",
                "dry: params+grads+optim", "model: same", "dry: act+temp", "model: act+other"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    diffs, tensor_diffs = [], []
    for name, entry in saved.items():
        for r in _with_tensor_bytes(name, entry):
            d, m = r["dry_run"], r["cost_model_memory"]
            states = d["parameters_bytes"] + d["gradients_bytes"] + d["optimizer_bytes"]
            m_states = m["parameters_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"]
            tensor_diff = (d["peak_bytes"] - m["tensor_bytes"]) / m["tensor_bytes"]
            diffs.append(abs(r["peak_difference"]))
            tensor_diffs.append(abs(tensor_diff))
            t.add_row(name, str(r["rank"]), f"{d['peak_bytes'] / GIB:.2f}", f"{m['total_bytes'] / GIB:.2f}",
                      f"{r['peak_difference']:+.0%}", f"{m['tensor_bytes'] / GIB:.2f}", f"{tensor_diff:+.0%}",
                      f"{states / GIB:.2f}", f"{m_states / GIB:.2f}",
                      f"{(d['peak_bytes'] - states) / GIB:.2f}",
                      f"{(m['activations_bytes'] + m['other_bytes']) / GIB:.2f}")
    if diffs:
        t.caption = (f"{len(diffs)} ranks of {len(saved)} plans: median |diff| {statistics.median(diffs):.1%}, "
                     f"against the model's tensors {statistics.median(tensor_diffs):.1%}")
    return t


if __name__ == "__main__":
    main()
