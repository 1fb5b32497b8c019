"""Which cost terms a held-out row's throughput error can sit in (a bench; issue 14 items 3, 6).

    PYTHONPATH=src python bench/heldout_terms.py                    # every H100 row
    PYTHONPATH=src python bench/heldout_terms.py --only lf-a100 tt- --json

For each row: the throughput error as ``meshplan validate`` takes it, the step's terms (compute,
recompute, exposed communication by kind, bubble, optimizer) as shares of the predicted step, and
the elasticity of the predicted throughput to each rate the calibration sets: the GEMM efficiency
(``matmul_efficiency``), the attention core's (``attention_efficiency``) and the memory-bound
ops' (``hbm_efficiency``): d ln(throughput) / d ln(rate) by a 10% step. An error can only come
from a term whose elasticity is of its size: a row +30% off with a GEMM elasticity of 0.2 is not
a GEMM-efficiency error. The last table gives the median per (GPU, framework, sequence bucket).
The rows are the held-out CSV's: nothing here fits anything.

``--series`` adds the long-context rows' per-key slope (issue 14 item 4): rows of one model, GPU,
stack and precision that run the same tokens per GPU and micro-batch at growing sequence length
(torchtitan's context-parallel tables: each rank keeps S/c = 32k tokens while S and c grow) differ
only in how many keys each query attends, so the time per token grows with S and nothing else.
Between consecutive rows the table gives that growth per 1k keys, measured and predicted, and
their ratio: where the ratio departs from 1 the error sits in the attention (its kernel, its
ring), not in the dense part the rows share.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import (
    Run,
    load_runs,
    predicted_metric,
    setting_calibration,
)
from meshplan.cost.step import estimate

HERE = Path(__file__).parent
DEFAULT_RUNS = HERE / "data" / "runs_heldout.csv"
RATES = ("matmul_efficiency", "attention_efficiency", "hbm_efficiency")
"""The calibration rates whose elasticity each row reports."""
STEP = 0.9
"""The rate is multiplied by this to measure the elasticity (a 10% step: small enough to stay on
one side of a max(), large enough to move the estimate)."""
SEQ_BUCKETS = ((4096, "<=4k"), (8192, "8k"), (float("inf"), ">=16k"))
KEYS_PER_SLOPE = 1024
"""The slope's unit: time per token per 1k more keys attended."""


def row_terms(run) -> dict[str, Any]:
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    pred = predicted_metric(run, est.step_time_s)
    terms = est.time.terms_s()
    total = sum(terms.values()) or 1.0
    elasticity = {}
    for rate in RATES:
        slower = estimate(run.model, run.cluster, run.training, run.plan,
                          calib.replace_fields(**{rate: getattr(calib, rate) * STEP}))
        elasticity[rate] = (est.step_time_s / slower.step_time_s - 1.0) / (STEP - 1.0)
    error = None if pred is None or run.measured is None else pred / run.measured - 1.0
    tokens = run.training.global_batch * run.training.seq_len / run.cluster.num_gpus  # per GPU and step
    return {"row_id": run.row_id, "model": run.model.name, "gpu": run.cluster.gpu.name, "plan": run.plan.notation(),
            "seq_len": run.training.seq_len, "precision": run.training.precision.value,
            "predicted_s_per_token": est.step_time_s / tokens,
            # the metric is a rate: predicted / measured = measured step / predicted step
            "measured_s_per_token": None if error is None else est.step_time_s * (1.0 + error) / tokens,
            "error": error,
            "shares": {k: v / total for k, v in terms.items() if v / total >= 0.005},
            "elasticity": elasticity}


def series_key(run: Run, framework: str) -> str:
    """Rows that share it differ only in sequence length and how it is split: one model, GPU,
    framework, precision, tp / pp and micro-batch, and the same tokens per GPU in a micro-batch
    (b S / c)."""
    p = run.plan.dims
    local = run.plan.micro_batch * run.training.seq_len // p.cp
    return (f"{run.model.name} {run.cluster.gpu.name} {framework} {run.training.precision.value} "
            f"tp{p.tp} pp{p.pp} mb{run.plan.micro_batch} {local} tokens/GPU")


def series_slopes(points: list[tuple[int, float, float]]) -> list[dict[str, float]]:
    """(sequence length, measured, predicted time per token) of one series: per consecutive pair
    of lengths, the growth of each time per KEYS_PER_SLOPE more keys and measured over predicted."""
    points = sorted(points)
    out = []
    for (s0, m0, p0), (s1, m1, p1) in pairwise(points):
        if s1 == s0:
            continue
        per = KEYS_PER_SLOPE / (s1 - s0)
        measured, predicted = (m1 - m0) * per, (p1 - p0) * per
        out.append({"from_seq": s0, "to_seq": s1, "measured": measured, "predicted": predicted,
                    "ratio": measured / predicted if predicted else float("nan")})
    return out


def seq_bucket(seq_len: int) -> str:
    return next(name for top, name in SEQ_BUCKETS if seq_len <= top)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--only", nargs="*", default=["h100"], help="row-id prefixes or GPU name parts (default: h100)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--series", action="store_true",
                    help="add the per-key slope of rows that differ only in sequence length (module docstring)")
    args = ap.parse_args(argv)
    with args.runs.open(newline="") as fh:
        framework = {r["id"]: r.get("framework") or "unstated" for r in csv.DictReader(fh)}
    runs, _ = load_runs(args.runs)
    picked = [r for r in runs if any(r.row_id.startswith(o) or o in r.cluster.gpu.name for o in args.only)]
    rows = [{**row_terms(r), "series": series_key(r, framework[r.row_id])} for r in picked]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["error"] is not None:
            groups.setdefault((r["gpu"], framework[r["row_id"]], seq_bucket(r["seq_len"])), []).append(r)
    summary = [{"gpu": g, "framework": f, "seq": s, "rows": len(rs),
                "median_error": statistics.median(r["error"] for r in rs),
                **{f"median_elasticity_{k}": statistics.median(r["elasticity"][k] for r in rs) for k in RATES}}
               for (g, f, s), rs in sorted(groups.items())]
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["measured_s_per_token"] is not None:
            series.setdefault(r["series"], []).append(r)
    slopes = {k: series_slopes([(r["seq_len"], r["measured_s_per_token"], r["predicted_s_per_token"]) for r in rs])
              for k, rs in sorted(series.items()) if len({r["seq_len"] for r in rs}) > 1} if args.series else {}
    if args.json:
        print(json.dumps({"rows": rows, "groups": summary, **({"series": slopes} if args.series else {})}, indent=1))
        return 0
    con = Console(width=160)
    t = Table(title="Held-out rows: error, step terms, elasticity to each rate")
    for col in ("row", "model", "plan", "error", "gemm", "attn", "hbm", "terms (share of step)"):
        t.add_column(col, justify="left" if col in ("row", "model", "plan", "terms (share of step)") else "right")
    for r in rows:
        e = r["elasticity"]
        t.add_row(r["row_id"], r["model"], r["plan"], "-" if r["error"] is None else f"{r['error']:+.1%}",
                  *(f"{e[k]:.2f}" for k in RATES), ", ".join(f"{k} {v:.0%}" for k, v in r["shares"].items()))
    con.print(t)
    t = Table(title="Median per GPU, framework and sequence")
    for col in ("gpu", "framework", "seq", "rows", "error", "gemm", "attn", "hbm"):
        t.add_column(col, justify="left" if col in ("gpu", "framework", "seq") else "right")
    for s in summary:
        t.add_row(s["gpu"], s["framework"], s["seq"], str(s["rows"]), f"{s['median_error']:+.1%}",
                  *(f"{s[f'median_elasticity_{k}']:.2f}" for k in RATES))
    con.print(t)
    if slopes:
        t = Table(title=f"Time per token per {KEYS_PER_SLOPE} more keys (us), rows of one series")
        for col in ("series", "seq", "measured", "predicted", "measured / predicted"):
            t.add_column(col, justify="left" if col in ("series", "seq") else "right")
        for name, steps in slopes.items():
            for st in steps:
                t.add_row(name, f"{st['from_seq']} -> {st['to_seq']}", f"{st['measured'] * 1e6:.3f}",
                          f"{st['predicted'] * 1e6:.3f}", f"{st['ratio']:.2f}")
        con.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
