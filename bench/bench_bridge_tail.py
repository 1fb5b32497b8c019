"""The p90 tail of the Megatron-Bridge rows that are not GPT-OSS (a bench, not a test; issue 14).

    PYTHONPATH=src python bench/bench_bridge_tail.py              # rows with |error| > 15%
    PYTHONPATH=src python bench/bench_bridge_tail.py --over 0.10 --json

From ``meshplan validate --runs megatron-bridge``'s estimates (nothing is fitted), two tables:

1. Per tail row: the signed error, the time the model lacks (measured step - predicted step), the
   share of the predicted step that the fitted per-layer device overhead (``layer_overhead_s``,
   none under full-iteration CUDA graphs) takes, and the value of that one constant that would
   close the row alone (bisected: the step is not linear in it where the host paces a layer; '-'
   where no value >= 0 can).
2. Per tail row: the rows of the same model, GPU, GPU count, global batch and layout from other
   releases (any precision: the 25.09 tables print none), with their measured throughput over the tail row's. The model gives one layout one
   estimate per release's settings, so a tail row whose twin in the next release measures 1.5-2x
   apart is not a term the model lacks but a release (or a table) the rows disagree on.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bench_gptoss_blackwell import _calib, _step_s  # noqa: E402 (bench/ is on sys.path when run)
from meshplan.calib.validate import Run, load_corrected_runs, predicted_metric
from meshplan.data.published import runs_csv

EXCLUDED_FAMILY = "gpt-oss-120b"
"""Round 1's subject (bench/bench_gptoss_blackwell.py); this bench is the rest of the tail."""
DEFAULT_OVER = 0.15


CLOSING_REL_TOL = 1e-9
"""Bisection stops when the overhead's bracket is this narrow relative to its upper end."""


def _closing_overhead_s(run: Run, calib, measured_step: float) -> float | None:
    """The layer_overhead_s at which the row's predicted step equals the measured one, or None where
    no value >= 0 reaches it. The step is linear in the overhead only while the device paces each
    layer; where the host paces it (cost/host.py: max(device, host)) it is not, so bisect: the step
    never falls as the overhead grows."""
    def step_at(overhead_s: float) -> float:
        return _step_s(run, calib.replace_fields(layer_overhead_s=overhead_s))

    lo = 0.0
    if step_at(lo) > measured_step:
        return None
    hi = max(calib.layer_overhead_s, 1e-6)
    while step_at(hi) < measured_step:
        lo, hi = hi, 2.0 * hi
        if hi > 1.0:  # a second per layer and micro-batch: no physical overhead
            return None
    while hi - lo > CLOSING_REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if step_at(mid) < measured_step else (lo, mid)
    return 0.5 * (lo + hi)


def tail_row(run: Run) -> dict[str, Any]:
    calib = _calib(run)
    step = _step_s(run, calib)
    pred = predicted_metric(run, step)
    error = pred / run.measured - 1.0
    measured_step = step * (1.0 + error)
    bare = _step_s(run, calib.replace_fields(layer_overhead_s=0.0))
    overhead_s = step - bare
    lacks = measured_step - step
    closing = _closing_overhead_s(run, calib, measured_step) if overhead_s > 1e-9 else None
    return {"row_id": run.row_id, "source": run.source, "model": run.model.name, "gpu": run.cluster.gpu.name,
            "precision": run.training.precision.value, "plan": run.plan.notation(), "error": error,
            "predicted_step_s": step, "missing_s": lacks, "layer_overhead_s": calib.layer_overhead_s,
            "layer_overhead_share": overhead_s / step, "closing_layer_overhead_s": closing,
            "cuda_graphs": bool(calib.cuda_graph_full_iteration)}


def twins(run: Run, runs: list[Run]) -> list[dict[str, Any]]:
    key = (run.model.name, run.cluster.gpu.name, run.cluster.num_gpus, run.plan.notation(), run.training.global_batch)
    return [{"row_id": r.row_id, "source": r.source, "precision": r.training.precision.value, "measured": r.measured,
             "over_tail_row": r.measured / run.measured}
            for r in runs if r.row_id != run.row_id and r.measured
            and (r.model.name, r.cluster.gpu.name, r.cluster.num_gpus, r.plan.notation(),
                 r.training.global_batch) == key]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over", type=float, default=DEFAULT_OVER, help="|signed error| above which a row is listed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs, _, _ = load_corrected_runs(runs_csv("megatron-bridge"))
    runs = [r for r in runs if r.measured and r.model.name != EXCLUDED_FAMILY]
    rows = []
    for run in runs:
        row = tail_row(run)
        if abs(row["error"]) > args.over:
            row["twins"] = twins(run, runs)
            rows.append(row)
    rows.sort(key=lambda r: r["error"])
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    con = Console(width=220)
    t = Table(title=f"Megatron-Bridge rows other than GPT-OSS with |error| > {100 * args.over:.0f}%")
    for col in ("id", "source", "model", "gpu", "prec", "plan", "error", "missing s", "overhead",
                "its share", "closing", "same layout elsewhere: measured / this"):
        t.add_column(col, justify="left" if col in ("id", "source", "model", "gpu", "prec", "plan") else "right")
    for r in rows:
        closing = r["closing_layer_overhead_s"]
        t.add_row(r["row_id"], r["source"].removeprefix("Megatron-Bridge "), r["model"], r["gpu"], r["precision"],
                  r["plan"][:48], f"{100 * r['error']:+.1f}%", f"{r['missing_s']:+.2f}",
                  "graphs" if r["cuda_graphs"] else f"{1e3 * r['layer_overhead_s']:.2f} ms",
                  f"{100 * r['layer_overhead_share']:.0f}%", "-" if closing is None else f"{1e3 * closing:.2f} ms",
                  ", ".join(f"{w['row_id']} ({w['source'].removeprefix('Megatron-Bridge ')}) {w['over_tail_row']:.2f}"
                            for w in r["twins"]))
    con.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
