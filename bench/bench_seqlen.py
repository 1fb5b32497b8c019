"""Packed variable-length documents on this machine's CPU: estimate against measured step time,
and the measured gain of balancing documents across data-parallel ranks (issue 18).

    PYTHONPATH=src python bench/bench_seqlen.py [--profile FILE] [--steps 6] [--json]

1. ``meshplan profile --quick --procs 4`` (skipped with --profile FILE), as bench_predict_cpu.py;
2. four length distributions, written as the files ``--seq-len-dist`` reads: ``uniform`` (1 to S
   tokens), ``power-law`` (Pareto, alpha 1.2, from 32 tokens, capped at 4 S: long documents are cut
   into sequences), ``mix`` (a pre-training-like mix: 70% short chat-like documents, lognormal
   around 150 tokens; 25% web pages around 600; 5% long documents of 2 S to 8 S) and ``bimodal``
   (half the tokens in documents of S, half in documents of 16);
3. for each, dp=2 with documents in data order (``stream``) and ``balanced``, plus one run of full
   sequences: the estimate with the profile (meshplan.calib.predict) and a real ``meshplan train``
   (measured = median step time after warm-up);
4. the table: predicted, measured, error; and per distribution the measured and predicted gain of
   balancing (1 - balanced / stream).
Prints figures; it is not a test (timings on a shared 2-core machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench_predict_cpu import run_profile, run_train  # noqa: E402
from meshplan.calib.predict import compare, predict, warmup_steps  # noqa: E402
from meshplan.plan import Job, ParallelDims, Plan  # noqa: E402
from meshplan.spec.cluster import system_preset  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.seqlen import DocBalance, SeqLenDist, from_samples, load_seq_len_dist  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402

MODEL_OVERRIDES = dict(num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=4, ffn_hidden_size=768,
                       vocab_size=2048)
"""bench_predict_cpu.py's model."""
SEQ_LEN = 2048
"""Long enough that the attention core is a large share of the step (4*S*D FLOPs per token against
the linears' ~24*D^2): what packing changes."""
GLOBAL_BATCH = 4
DRAWS = 20_000
"""Documents drawn to write each distribution's histogram (seeded: the files are reproducible)."""


def distributions() -> dict[str, SeqLenDist]:
    rng = np.random.default_rng(0)
    S = SEQ_LEN
    uniform = rng.integers(1, S + 1, DRAWS)
    power = np.minimum(32 * (1 + rng.pareto(1.2, DRAWS)), 4 * S).astype(np.int64)
    kind = rng.choice(3, DRAWS, p=[0.70, 0.25, 0.05])
    mix = np.where(kind == 0, rng.lognormal(np.log(150), 0.6, DRAWS),
                   np.where(kind == 1, rng.lognormal(np.log(600), 0.5, DRAWS), rng.integers(2 * S, 8 * S, DRAWS)))
    mix = np.maximum(mix, 1).astype(np.int64)
    # half the tokens in whole-sequence documents, half in 16-token ones: the imbalance that
    # balancing removes, large enough to measure on a shared host
    bimodal = np.array([S] * 40 + [16] * (40 * S // 16))
    return {name: from_samples(x, source=f"{name}.csv") for name, x in
            (("uniform", uniform), ("power-law", power), ("mix", mix), ("bimodal", bimodal))}


def write_histogram(dist: SeqLenDist, path: Path) -> None:
    path.write_text("length,count\n" + "".join(f"{n},{c}\n" for n, c in zip(dist.lengths, dist.counts)))


def make_job(dist: SeqLenDist | None, balance: DocBalance) -> Job:
    model = model_preset("toy-llama").with_overrides(MODEL_OVERRIDES)
    training = TrainingSpec(seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, precision=Precision.FP32,
                            seq_len_dist=dist, doc_balance=balance if dist else DocBalance.STREAM)
    plan = Plan(dims=ParallelDims(dp_replicate=2), micro_batch=1)
    return Job(model=model, training=training, cluster=system_preset("cpu").with_gpus(2), plan=plan.with_defaults(model))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="Use this profile instead of measuring one per round.")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1,
                    help="Rounds: each profiles the CPU, then runs every case; measured = median over rounds.")
    ap.add_argument("--only", help="Comma-separated distributions to run (and the full sequences).")
    ap.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = ap.parse_args()
    con = Console(stderr=True, highlight=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = [("full sequences", None, DocBalance.STREAM)]
        for name, dist in distributions().items():
            if args.only and name not in args.only.split(","):
                continue
            write_histogram(dist, work / dist.source)
            read = replace(load_seq_len_dist(work / dist.source), source=dist.source)  # the CLI's reader
            cases += [(name, read, DocBalance.STREAM), (name, read, DocBalance.BALANCED)]
        # per case, per round: (predicted with that round's profile, measured median step, steps)
        runs: dict[int, list[tuple[float, float, list[float]]]] = {i: [] for i in range(len(cases))}
        errors: dict[int, str] = {}
        for r in range(args.repeats):
            profile = args.profile
            if profile is None:
                profile = str(work / f"profile-{r}.json")
                t0 = time.monotonic()
                run_profile(Path(profile))
                con.print(f"round {r + 1}: profiled the CPU in {time.monotonic() - t0:.0f} s")
            for i, (name, dist, balance) in enumerate(cases):
                job = make_job(dist, balance)
                t0 = time.monotonic()
                times, peak, err = run_train(job, work, args.steps)
                if err:
                    errors[i] = err
                else:
                    cmp = compare(predict(job, profile, "cpu"), times, peak)
                    runs[i].append((cmp.predicted_step_time_s, cmp.measured_step_time_s,
                                    times[warmup_steps(len(times)):]))
                con.print(f"round {r + 1}: {name} {balance.value if dist else ''}: {time.monotonic() - t0:.0f} s"
                          + (f" (failed: {err})" if err else ""))
        rows = []
        for i, (name, dist, balance) in enumerate(cases):
            row = {"distribution": name, "balance": balance.value if dist else "-",
                   "mean_doc_tokens": dist.mean_length if dist else float(SEQ_LEN), "error": errors.get(i, "")}
            if runs[i]:
                row.update(predicted_step_time_s=statistics.median(p for p, _, _ in runs[i]),
                           measured_step_time_s=statistics.median(m for _, m, _ in runs[i]),
                           rounds=[[p, m] for p, m, _ in runs[i]], steps_s=[s for _, _, s in runs[i]])
                row["step_time_error"] = row["predicted_step_time_s"] / row["measured_step_time_s"] - 1
            rows.append(row)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    render(rows, Console(highlight=False, width=160))


def render(rows: list[dict], con: Console) -> None:
    t = Table(title=f"Packed documents, CPU, toy-llama {MODEL_OVERRIDES} S={SEQ_LEN} B={GLOBAL_BATCH} dp=2 fp32")
    for col in ("distribution", "balance", "mean doc", "pred s", "meas s", "err", "pred / full", "meas / full",
                "rounds pred/meas s"):
        t.add_column(col, justify="left" if col in ("distribution", "balance") else "right")
    full = rows[0] if "measured_step_time_s" in rows[0] else None
    for r in rows:
        meas = r.get("measured_step_time_s")
        if not meas:
            t.add_row(r["distribution"], r["balance"], f"{r['mean_doc_tokens']:.0f}", "-", "-", r["error"][:40])
            continue
        ratios = (f"{r['predicted_step_time_s'] / full['predicted_step_time_s']:.2f}",
                  f"{meas / full['measured_step_time_s']:.2f}") if full else ("-", "-")
        t.add_row(r["distribution"], r["balance"], f"{r['mean_doc_tokens']:.0f}", f"{r['predicted_step_time_s']:.3f}",
                  f"{meas:.3f}", f"{r['step_time_error']:+.1%}", *ratios,
                  " ".join(f"{p:.2f}/{m:.2f}" for p, m in r["rounds"]))
    con.print(t)
    done = [r for r in rows if "measured_step_time_s" in r]
    if done:
        errs = sorted(abs(r["step_time_error"]) for r in done)
        con.print(f"step time: median |err| {statistics.median(errs):.1%}, max {errs[-1]:.1%} over {len(done)} runs")
    for name in dict.fromkeys(r["distribution"] for r in rows if r["balance"] != "-"):
        pair = {r["balance"]: r for r in rows if r["distribution"] == name}
        if {"stream", "balanced"} <= set(pair) and "predicted_step_time_s" in pair["stream"] \
                and "predicted_step_time_s" in pair["balanced"]:
            s, b = pair["stream"], pair["balanced"]
            pred_gain = 1 - b["predicted_step_time_s"] / s["predicted_step_time_s"]
            meas = ("measured_step_time_s" in s and "measured_step_time_s" in b)
            meas_gain = f"{1 - b['measured_step_time_s'] / s['measured_step_time_s']:+.1%}" if meas else "-"
            con.print(f"{name}: gain of balancing, predicted {pred_gain:+.1%}, measured {meas_gain}")


if __name__ == "__main__":
    main()
