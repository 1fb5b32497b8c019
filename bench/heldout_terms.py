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
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import load_runs, predicted_metric, setting_calibration
from meshplan.cost.step import estimate

HERE = Path(__file__).parent
DEFAULT_RUNS = HERE / "data" / "runs_heldout.csv"
RATES = ("matmul_efficiency", "attention_efficiency", "hbm_efficiency")
"""The calibration rates whose elasticity each row reports."""
STEP = 0.9
"""The rate is multiplied by this to measure the elasticity (a 10% step: small enough to stay on
one side of a max(), large enough to move the estimate)."""
SEQ_BUCKETS = ((4096, "<=4k"), (8192, "8k"), (float("inf"), ">=16k"))


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
    return {"row_id": run.row_id, "model": run.model.name, "gpu": run.cluster.gpu.name, "plan": run.plan.notation(),
            "seq_len": run.training.seq_len, "precision": run.training.precision.value,
            "error": None if pred is None or run.measured is None else pred / run.measured - 1.0,
            "shares": {k: v / total for k, v in terms.items() if v / total >= 0.005},
            "elasticity": elasticity}


def seq_bucket(seq_len: int) -> str:
    return next(name for top, name in SEQ_BUCKETS if seq_len <= top)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--only", nargs="*", default=["h100"], help="row-id prefixes or GPU name parts (default: h100)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with args.runs.open(newline="") as fh:
        framework = {r["id"]: r.get("framework") or "unstated" for r in csv.DictReader(fh)}
    runs, _ = load_runs(args.runs)
    picked = [r for r in runs if any(r.row_id.startswith(o) or o in r.cluster.gpu.name for o in args.only)]
    rows = [row_terms(r) for r in picked]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["error"] is not None:
            groups.setdefault((r["gpu"], framework[r["row_id"]], seq_bucket(r["seq_len"])), []).append(r)
    summary = [{"gpu": g, "framework": f, "seq": s, "rows": len(rs),
                "median_error": statistics.median(r["error"] for r in rs),
                **{f"median_elasticity_{k}": statistics.median(r["elasticity"][k] for r in rs) for k in RATES}}
               for (g, f, s), rs in sorted(groups.items())]
    if args.json:
        print(json.dumps({"rows": rows, "groups": summary}, indent=1))
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
