"""Predicted versus measured on this machine's CPU: profile, then predict and run >= 8 plans.

    PYTHONPATH=src python bench/bench_predict_cpu.py [--profile FILE] [--steps 6] [--json]

1. ``meshplan profile --quick --procs 4`` at the start of every round (skipped with --profile
   FILE): each round's runs are predicted with the profile measured just before them;
2. for each plan of a small Llama-style model over 1 to 4 processes (single, pure DP, FSDP,
   TP+SP, PP with two schedules, CP, recompute on/off, two micro-batch sizes, DPxTP): the
   estimate with the profile (meshplan.calib.predict) and a real run (``meshplan train`` for a
   few steps; measured = median step time after warm-up, peak = max resident memory of a rank);
3. the error table, with median and p90 absolute errors, and the estimate's breakdown so the
   dominant error can be read off.
Prints figures; it is not a test (timings on a shared 2-core machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from meshplan.plan import CPMethod, Job, ParallelDims, Plan, Recompute, Schedule  # noqa: E402
from meshplan.calib.predict import compare, predict, warmup_steps  # noqa: E402
from meshplan.spec.cluster import system_preset  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402

# Small enough for a few steps in seconds, large enough that matmuls (not Python) dominate.
MODEL_OVERRIDES = dict(num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=4, ffn_hidden_size=768,
                       vocab_size=2048)
SEQ_LEN = 256
GLOBAL_BATCH = 8


@dataclass(frozen=True)
class Case:
    name: str
    plan: Plan


def cases() -> list[Case]:
    d = ParallelDims
    return [
        Case("single", Plan(micro_batch=4)),
        Case("dp2", Plan(dims=d(dp_replicate=2), micro_batch=4)),
        Case("dp2 mb2", Plan(dims=d(dp_replicate=2), micro_batch=2)),
        Case("dp2 full recompute", Plan(dims=d(dp_replicate=2), micro_batch=4, recompute=Recompute.FULL)),
        Case("fsdp2 (zero 3)", Plan(dims=d(dp_shard=2), zero=3, micro_batch=4)),
        Case("tp2+sp", Plan(dims=d(tp=2), sp=True, micro_batch=4)),
        Case("cp2 all-to-all", Plan(dims=d(cp=2), cp_method=CPMethod.ALL_TO_ALL, micro_batch=4)),
        Case("pp2 1f1b", Plan(dims=d(pp=2), schedule=Schedule.ONE_F_ONE_B, micro_batch=2)),
        Case("pp2 gpipe", Plan(dims=d(pp=2), schedule=Schedule.GPIPE, micro_batch=2)),
        Case("dp2 x tp2", Plan(dims=d(dp_replicate=2, tp=2), micro_batch=4)),
    ]


def make_job(plan: Plan) -> Job:
    model = model_preset("toy-llama").with_overrides(MODEL_OVERRIDES)
    training = TrainingSpec(seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, precision=Precision.FP32)
    world = plan.dims.world_size
    return Job(model=model, training=training, cluster=system_preset("cpu").with_gpus(world),
               plan=plan.with_defaults(model))


def run_profile(out: Path) -> None:
    cmd = [sys.executable, "-m", "meshplan", "profile", "--quick", "--procs", "4", "--device", "cpu",
           "--out", str(out), "--json"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=_env())


def keep_profile(profile: Path, folder: Path) -> None:
    """A copy of a round's profile (its name: profile-<round>.json) kept after the bench."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / profile.name).write_text(profile.read_text())


def run_train(job: Job, work: Path, steps: int) -> tuple[list[float], float, str]:
    """(step times, peak resident GiB, error text) of a real ``meshplan train`` run."""
    job_path, log_path = work / "job.json", work / "log.jsonl"
    job.save(job_path)
    log_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "meshplan", "train", "--plan", str(job_path), "--steps", str(steps),
           "--log", str(log_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        causes = [ln for ln in lines if "Error" in ln or "error:" in ln]  # the worker's own exception
        return [], 0.0, (causes[0] if causes else lines[-1] if lines else f"exit {res.returncode}")
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    steps_rec = [r for r in records if "step" in r and "step_time_s" in r]
    peaks = [r["peak_memory_gib"] for r in records if r.get("peak_memory_gib") is not None]
    return [r["step_time_s"] for r in steps_rec], max(peaks), ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="Use this profile instead of measuring one.")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", help="Comma-separated case names to run.")
    ap.add_argument("--repeats", type=int, default=1,
                    help="Run every plan this many times, in interleaved rounds; measured = median over runs "
                         "(spreads a shared host's slow spells over all plans).")
    ap.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    ap.add_argument("--save-profile", help="Keep the profile the first round measured at this path.")
    ap.add_argument("--keep-profiles", help="Copy every round's profile into this folder (profile-<round>.json).")
    args = ap.parse_args()
    con = Console(stderr=True, highlight=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        chosen = [c for c in cases() if not args.only or c.name in args.only.split(",")]
        # (profile, step time, peak GiB, load) per round: each round's runs are predicted with the
        # profile measured just before them, so a slow or fast spell of the host lands on both.
        runs: dict[str, list[tuple[str, float, float, float]]] = {c.name: [] for c in chosen}
        errors: dict[str, str] = {}
        for r in range(args.repeats):
            profile = args.profile
            if profile is None:
                profile = str(work / f"profile-{r}.json")
                t0 = time.monotonic()
                run_profile(Path(profile))
                con.print(f"round {r + 1}: profiled the CPU in {time.monotonic() - t0:.0f} s")
                if args.save_profile and r == 0:
                    Path(args.save_profile).write_text(Path(profile).read_text())
                if args.keep_profiles:
                    keep_profile(Path(profile), Path(args.keep_profiles))
            for case in chosen:
                t0 = time.monotonic()
                times, peak, err = run_train(make_job(case.plan), work, args.steps)
                if err:
                    errors[case.name] = err
                else:
                    kept = times[warmup_steps(len(times)):]
                    runs[case.name].append((profile, statistics.median(kept), peak, os.getloadavg()[0]))
                con.print(f"round {r + 1}: {case.name}: {time.monotonic() - t0:.0f} s" + (f" (failed: {err})" if err else ""))
        rows = [_row(case, runs[case.name], errors.get(case.name, ""), args.profile or str(work / "profile-0.json"))
                for case in chosen]
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    render(rows, Console(highlight=False, width=190))


def _row(case: Case, runs: list[tuple[str, float, float, float]], error: str, first_profile: str) -> dict:
    """Predicted vs measured for one plan: per round, the prediction from that round's profile
    against that round's run; the medians over rounds (the error is the median of the rounds')."""
    job = make_job(case.plan)
    preds = [predict(job, prof, "cpu") for prof, _, _, _ in runs] or [predict(job, first_profile, "cpu")]
    pred = preds[0]
    row = {"case": case.name, "plan": job.plan.notation(), "procs": job.plan.dims.world_size,
           "predicted_step_time_s": statistics.median(p.step_time_s for p in preds),
           "predicted_peak_memory_gib": pred.peak_memory_gib,
           "compute_s": pred.estimate.time.compute_s,
           "exposed_comm_s": pred.estimate.time.exposed_communication_s,
           "bubble_s": pred.estimate.time.bubble_s, "optimizer_s": pred.estimate.time.optimizer_s,
           "error": error}
    if runs:
        cmps = [compare(p, [t], peak) for p, (_, t, peak, _) in zip(preds, runs)]
        row.update(measured_step_time_s=statistics.median(c.measured_step_time_s for c in cmps),
                   step_time_error=statistics.median(c.step_time_error for c in cmps),
                   measured_peak_memory_gib=max(c.measured_peak_memory_gib for c in cmps),
                   peak_memory_error=(pred.peak_memory_gib - max(c.measured_peak_memory_gib for c in cmps))
                   / max(c.measured_peak_memory_gib for c in cmps),
                   runs_predicted_s=[p.step_time_s for p in preds],
                   runs_step_time_s=[t for _, t, _, _ in runs],
                   load_avg=[a for _, _, _, a in runs])
    return row


def render(rows: list[dict], con: Console) -> None:
    t = Table(title=f"Predicted vs measured, CPU, toy-llama {MODEL_OVERRIDES} S={SEQ_LEN} B={GLOBAL_BATCH} fp32")
    for col in ("case", "procs", "pred s", "meas s", "err", "pred GiB", "meas GiB", "err",
                "compute", "comm", "bubble", "optim", "rounds pred/meas s", "load"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        if "measured_step_time_s" not in r:
            t.add_row(r["case"], str(r["procs"]), f"{r['predicted_step_time_s']:.3f}", "-", "-",
                      f"{r['predicted_peak_memory_gib']:.3f}", "-", "-", "", "", "", "", "", r["error"][:40])
            continue
        t.add_row(r["case"], str(r["procs"]), f"{r['predicted_step_time_s']:.3f}", f"{r['measured_step_time_s']:.3f}",
                  f"{r['step_time_error']:+.0%}", f"{r['predicted_peak_memory_gib']:.3f}",
                  f"{r['measured_peak_memory_gib']:.3f}", f"{r['peak_memory_error']:+.0%}",
                  f"{r['compute_s']:.3f}", f"{r['exposed_comm_s']:.3f}", f"{r['bubble_s']:.3f}",
                  f"{r['optimizer_s']:.3f}", " ".join(f"{p:.2f}/{m:.2f}" for p, m in zip(r["runs_predicted_s"], r["runs_step_time_s"])),
                  " ".join(f"{x:.0f}" for x in r["load_avg"]))
    con.print(t)
    done = [r for r in rows if "measured_step_time_s" in r]
    if done:
        st = sorted(abs(r["step_time_error"]) for r in done)
        mem = sorted(abs(r["peak_memory_error"]) for r in done)
        p90 = lambda xs: xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]  # noqa: E731
        con.print(f"{len(done)} plans run ({len(rows) - len(done)} failed). "
                  f"step time: median |err| {statistics.median(st):.1%}, p90 {p90(st):.1%}; "
                  f"peak memory: median |err| {statistics.median(mem):.1%}, p90 {p90(mem):.1%}")


if __name__ == "__main__":
    main()
