"""Dry runs on torch's fake process group: every frontier point of mid-size jobs runs, and the
pieces of the report are checked by hand.

The frontier jobs are real models cut to 2 layers (full width, vocabulary and sequence), so each
simulated rank takes seconds: `meshplan plan --json` gives the frontier, each point is written as a
Job and dry-run (rank 0; the first and last rank when it has pipeline stages), in one worker process
per rank as `train --dry-run` does. Any error fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.report.dryrun import compare
from meshplan.report.dryrun_expected import expected_collectives
from meshplan.runtime.dryrun_launch import parse_ranks, run_ranks
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.model import parse_overrides
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

SRC = str(Path(__file__).resolve().parents[2] / "src")
FRONTIER_JOBS = {
    # 11 points: FSDP, HSDP-less ZeRO-2, tp + sp, recompute (llama3.2-1b width, 2 layers)
    "dense-8": ["--model", "llama3.2-1b", "--override", "num_layers=2", "--gpu", "h100-sxm",
                "--gpus", "8", "--seq-len", "1024", "--global-batch", "16"],
    # context parallel (ring), tp up to 16 across nodes, HSDP, recompute, at 16K tokens
    "long-16": ["--model", "llama3.2-1b", "--override", "num_layers=2", "--gpu", "h100-sxm",
                "--gpus", "16", "--seq-len", "16384", "--global-batch", "4", "--memory-gib", "10"],
}
SLOW_FRONTIER_JOBS = {"long-16"}
"""Longer (about 3 minutes of CPU): marked slow, run with the multi-process suite."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _frontier_jobs(args: list[str]) -> list[Job]:
    proc = subprocess.run([sys.executable, "-m", "meshplan", "plan", *args, "--top", "0", "--json"],
                          env=_env(), capture_output=True, text=True, check=True)
    frontier = json.loads(proc.stdout)["frontier"]
    opts = dict(zip(args[::2], args[1::2]))
    model = model_preset(opts["--model"]).with_overrides(parse_overrides(opts["--override"]))
    training = TrainingSpec(seq_len=int(opts["--seq-len"]), global_batch=int(opts["--global-batch"]))
    cluster = resolve_cluster(gpu=opts["--gpu"], gpus=int(opts["--gpus"]))
    return [Job(model=model, training=training, cluster=cluster, plan=Plan.from_dict(p["plan_detail"]))
            for p in frontier]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_FRONTIER_JOBS else n
                                  for n in sorted(FRONTIER_JOBS)])
def test_every_frontier_point_dry_runs(name: str) -> None:
    jobs = _frontier_jobs(FRONTIER_JOBS[name])
    assert len(jobs) >= 5
    for job in jobs:
        ranks = parse_ranks("first,last" if job.plan.dims.pp > 1 else "first", job)
        results = run_ranks(job, ranks, steps=1, timeout_s=300)
        for res, cmp in zip(results, compare(job, results)):
            note = f"{job.plan.notation()} rank {res['rank']}"
            assert res["parameters_bytes"] > 0 and res["gradients_bytes"] > 0, note
            assert res["optimizer_bytes"] > 0, note  # AdamW moments exist after the step
            assert res["peak_bytes"] >= res["parameters_bytes"], note
            assert res["collectives"], note  # 8 ranks: some collective every step
            assert cmp.model_memory["total_bytes"] > 0


def test_cli_dry_run_pipeline_and_tied_embeddings(tmp_path: Path) -> None:
    """Through the real entry point: a GPT-2-style (tied, learned positions) 2-stage tp2 plan, first
    and last rank; the last one holds the LM head and sends the tied-embedding gradient."""
    model = model_preset("gpt2").with_overrides({"num_layers": 2, "vocab_size": 50304})  # tp-divisible
    job = Job(model=model, training=TrainingSpec(seq_len=512, global_batch=8),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=8),
              plan=Plan(dims=ParallelDims(pp=2, tp=2, dp_shard=2), zero=1, sp=True))
    path = tmp_path / "job.json"
    job.save(path)
    proc = subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(path), "--dry-run",
                           "--simulate", "--json"], env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [r["rank"] for r in out["ranks"]] == [0, 7]
    first, last = out["ranks"]
    assert first["pp_rank"] == 0 and last["pp_rank"] == 1
    axes_last = {a for c in last["dry_run"]["collectives"] for a in c["axis"].split("=")}
    assert {"tp", "pp", "pp_tied", "dp_shard_cp"} <= axes_last
    # micro-batches of 1 row: 8 sequences over dp 2 -> 4 per step, each sent forward and back
    sends = [c for c in first["collectives"] if c["group"] == "pp" and c["kind"] == "send"]
    assert sends[0]["model_count"] == 2 * 4


def test_moe_expert_parallel_uses_balanced_routing() -> None:
    model = model_preset("mixtral-8x7b").with_overrides({"num_layers": 1})
    job = Job(model=model, training=TrainingSpec(seq_len=256, global_batch=4),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=4),
              plan=Plan(dims=ParallelDims(dp_shard=4, ep=4), zero=3))
    (res,) = run_ranks(job, [3], steps=1, timeout_s=300)
    assert res["reference_paths"] == ["moe-routing", "fused-norm-kernel"]
    a2a = {"ep" if "ep" in c["axis"].split("=") else c["axis"]: c
           for c in res["collectives"] if c["kind"] == "all_to_all"}
    # per MoE layer: counts + tokens out + tokens back, forward; tokens back and out again, backward
    assert a2a["ep"]["count"] == 5
    # T*k rows of D values each way and again in backward, all in bf16 (FSDP2 mixed precision: the
    # norm's output and the experts' matmul output are bf16); plus the E int64 counts.
    T, k, D = 256, 2, model.hidden_size
    assert a2a["ep"]["total_bytes"] == 2 * T * k * D * (2 + 2) + model.moe_num_experts * 8


def test_expected_collectives_by_hand() -> None:
    """tp2 without sp, 2 layers, 4 micro-batches of 1 x 1024 tokens, bf16: 4 all-reduces of
    (1024 x D x 2 B) per layer pass (Megatron f and g, forward and backward)."""
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 2})
    job = Job(model=model, training=TrainingSpec(seq_len=1024, global_batch=4),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=2), plan=Plan(dims=ParallelDims(tp=2)))
    (tp,) = [e for e in expected_collectives(job, 0) if e.group == "tp"]
    D = model.hidden_size
    assert (tp.kind, tp.count) == ("all_reduce", 4 * 2 * 4)
    assert tp.total_bytes == 4 * 2 * 4 * 1024 * D * 2


@pytest.mark.parametrize("spec,expected", [("first,last", [0, 15]), ("all", list(range(16))),
                                           ("3,first,3", [0, 3]), ("last", [15])])
def test_parse_ranks(spec: str, expected: list[int]) -> None:
    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=64, global_batch=16),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=16), plan=Plan(dims=ParallelDims(dp_replicate=16)))
    assert parse_ranks(spec, job) == expected


@pytest.mark.parametrize("spec", ["16", "-1", "two"])
def test_parse_ranks_refuses(spec: str) -> None:
    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=64, global_batch=16),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=16), plan=Plan(dims=ParallelDims(dp_replicate=16)))
    with pytest.raises(MeshplanError, match="--ranks"):
        parse_ranks(spec, job)


def test_cli_bad_ranks_is_one_line(tmp_path: Path) -> None:
    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=64, global_batch=4),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=2), plan=Plan(dims=ParallelDims(dp_replicate=2)))
    job.save(tmp_path / "j.json")
    proc = subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(tmp_path / "j.json"),
                           "--dry-run", "--ranks", "5"], env=_env(), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert "rank 5 is outside the plan's world of 2 ranks" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_report_pairs_measured_and_model_collectives() -> None:
    """Recvs pair with sends and are not charged again; a group shared by dp_shard and ep puts its
    all-to-alls under ep and its gathers under dp; the rendered tables name the differences."""
    from rich.console import Console

    from meshplan.report.dryrun import render

    model = model_preset("mixtral-8x7b").with_overrides({"num_layers": 1})
    job = Job(model=model, training=TrainingSpec(seq_len=256, global_batch=4),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=4),
              plan=Plan(dims=ParallelDims(dp_shard=4, ep=4), zero=3))
    shared = "dp_shard=dp_shard_cp=dp=dp_cp=ep"
    measured = {"rank": 0, "world_size": 4, "coords": {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0},
                "stages": [0], "parameters_bytes": 4, "gradients_bytes": 4, "optimizer_bytes": 8,
                "peak_bytes": 100, "peak_by_category": {"Activation": 84}, "microbatches": 1, "steps": 2,
                "wall_s": 1.0, "reference_paths": ["moe-routing"],
                "collectives": [{"kind": "all_to_all", "axis": shared, "count": 5, "total_bytes": 10},
                                {"kind": "all_gather", "axis": shared, "count": 4, "total_bytes": 20},
                                {"kind": "recv", "axis": "pp", "count": 3, "total_bytes": 30}]}
    (cmp,) = compare(job, [measured])
    rows = {(r["group"], r["kind"]): r for r in cmp.collectives}
    assert rows[("ep", "all_to_all")]["count"] == 5 and rows[("dp", "all_gather")]["bytes"] == 20
    assert not any(k == "recv" for _, k in rows)
    assert rows[("ep", "all_to_all")]["model_count"] == 4  # dispatch + combine, forward and backward
    console = Console(width=120, record=True)
    console.print(render(job, [cmp]))
    text = console.export_text()
    assert "moe-routing" in text and "fp32 weights" in text and "rank 0 (pp 0" in text


def test_cli_ranks_without_dry_run_is_refused(tmp_path: Path) -> None:
    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=64, global_batch=4),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=2), plan=Plan(dims=ParallelDims(dp_replicate=2)))
    job.save(tmp_path / "j.json")
    proc = subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(tmp_path / "j.json"),
                           "--ranks", "all"], env=_env(), capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "--ranks picks the ranks of a --dry-run" in proc.stderr + proc.stdout


@pytest.mark.parametrize(("zero", "gathers", "reductions"), [(1, 3, 3), (2, 3, 6), (3, 12, 6)])
def test_zero_stage_sets_gathers_and_reductions_per_step(zero: int, gathers: int, reductions: int) -> None:
    """Two micro-batches per rank, 3 FSDP units (2 layers + root). ZeRO-1/2 keep the gathered 16-bit
    weights from the first forward to the last backward: one gather per unit and step; ZeRO-3
    gathers each unit in every micro-batch's forward and backward (2 x 2 x 3). Gradients are
    reduced once per step for ZeRO-1, per micro-batch for ZeRO-2/3. Weights travel as bf16
    (2 B/param, mixed precision), gradients as fp32 (4 B/param)."""
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 2})
    job = Job(model=model, training=TrainingSpec(seq_len=256, global_batch=16),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=8),
              plan=Plan(dims=ParallelDims(dp_shard=8), zero=zero, micro_batch=1))
    (res,) = run_ranks(job, [0], steps=2, timeout_s=300)
    assert res["microbatches"] == 2
    tally = {c["kind"]: c for c in res["collectives"]}
    assert (tally["all_gather"]["count"], tally["reduce_scatter"]["count"]) == (gathers, reductions)
    P = model.num_params()
    assert tally["all_gather"]["total_bytes"] == gathers // 3 * 2 * P
    assert tally["reduce_scatter"]["total_bytes"] == reductions // 3 * 4 * P


@pytest.mark.parametrize("zero", [2, 3])
def test_hsdp_all_reduces_the_replicas_once_per_step(zero: int) -> None:
    """HSDP (2 replicas x 4 shards), two micro-batches per rank, 3 FSDP units: the shards are
    reduce-scattered every micro-batch but all-reduced over the replicas once per step, on the last
    (summed meanwhile), as the cost model charges (cost/dp_comm.py); it was once per micro-batch."""
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 2})
    job = Job(model=model, training=TrainingSpec(seq_len=256, global_batch=16),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=8),
              plan=Plan(dims=ParallelDims(dp_replicate=2, dp_shard=4), zero=zero, micro_batch=1))
    (res,) = run_ranks(job, [0], steps=2, timeout_s=300)
    assert res["microbatches"] == 2
    tally = {c["kind"]: c for c in res["collectives"]}
    assert (tally["reduce_scatter"]["count"], tally["all_reduce"]["count"]) == (6, 3)
    assert tally["all_reduce"]["total_bytes"] == 4 * model.num_params() // 4  # fp32 shards, once


@pytest.mark.parametrize("zero", [2, 3])
def test_pipelined_hsdp_all_reduces_the_replicas_once_per_step(zero: int) -> None:
    """The same under torch's pipelining (pp 2, 1F1B, 2 replicas x 4 shards, two micro-batches):
    rank 0's first stage (2 FSDP units) reduce-scatters every micro-batch and all-reduces over the
    replicas on the last only (pipeline.ZeroStage); it was once per micro-batch (4 calls)."""
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 2})
    job = Job(model=model, training=TrainingSpec(seq_len=256, global_batch=16),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=16),
              plan=Plan(dims=ParallelDims(pp=2, dp_replicate=2, dp_shard=4), zero=zero, micro_batch=1,
                        schedule="1f1b"))
    (res,) = run_ranks(job, [0], steps=2, timeout_s=300)
    assert res["microbatches"] == 2
    tally = {(c["kind"], c["axis"]): c for c in res["collectives"]}
    scatter, replicas = tally["reduce_scatter", "dp_shard_cp"], tally["all_reduce", "dp_replicate"]
    assert (scatter["count"], replicas["count"]) == (4, 2)
    # fp32 shards once: the scattered inputs (whole fp32 gradients, 2 micro-batches) / 2 / 4 shards
    assert replicas["total_bytes"] == scatter["total_bytes"] // (2 * 4)
