"""How much of each published run's layer time is the host's (a bench, not a test; issue 14 item 3).

    PYTHONPATH=src python bench/host_share.py                      # runs_heldout.csv, every row
    PYTHONPATH=src python bench/host_share.py --only lf-h100 tt- --json

For every row: the throughput error as ``meshplan validate`` takes it, the tokens per micro-batch,
the predicted device time of one layer for one micro-batch (forward + backward, recompute
included) and the host time to launch its kernels (cost/host.py: kernels x host_s_per_kernel of
the row's stack), and their ratio. A cost that does not scale with the tokens (launches, host
work per op or per module) can only explain a row's error where the host share is of the size of
the error ('bound at': the host time per kernel at which the layer would turn host-bound,
against the stack's 5 us); the last table splits the error by sequence length and by host share to show which.
Rows are the held-out CSV's: nothing here fits anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import load_runs, predicted_metric, setting_calibration
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.host import host_launch_s
from meshplan.cost.step import estimate
from meshplan.spec.layers import layer_kind

HERE = Path(__file__).parent
DEFAULT_RUNS = HERE / "data" / "runs_heldout.csv"


def row_share(run) -> dict[str, Any]:
    """The row's error, its layer's device time and host launch time per micro-batch."""
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    pred = predicted_metric(run, est.step_time_s)
    err = None if pred is None or run.measured is None else pred / run.measured - 1.0
    host_f, host_b = host_launch_s(run.model, run.cluster, layer_kind(run.model, 0),
                                   PlanArrays.from_plans([run.plan]), calib)
    host_s = float(np.asarray(host_f).ravel()[0]) + float(np.asarray(host_b).ravel()[0])
    t = est.time
    per_layer_s = t.compute_s / max(t.num_microbatches, 1) / max(max(s.layers for s in est.stages), 1)
    return {"row_id": run.row_id, "model": run.model.name, "gpu": run.cluster.gpu.name,
            "seq_len": run.training.seq_len, "micro_batch": run.plan.micro_batch,
            "tokens_per_microbatch": run.plan.micro_batch * run.training.seq_len // run.plan.dims.cp,
            "recompute": run.plan.recompute.value, "error": err, "layer_compute_s": per_layer_s,
            "layer_host_s": host_s, "host_share": host_s / per_layer_s if per_layer_s else 0.0,
            "host_bound_at_s_per_kernel": calib.host_s_per_kernel * per_layer_s / host_s if host_s else None}


def _median(rows: list[dict[str, Any]]) -> str:
    errs = [r["error"] for r in rows if r["error"] is not None]
    return f"{np.median(errs):+.1%} ({len(errs)})" if errs else "-"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--only", nargs="*", default=[], help="row id prefixes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs, _ = load_runs(args.runs)
    rows = [row_share(r) for r in runs if not args.only or any(r.row_id.startswith(p) for p in args.only)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    con = Console(width=130)
    t = Table(title=f"Host share of a layer's time per micro-batch: {args.runs.name}")
    for col in ("row", "model", "gpu", "seq", "mb", "AC", "error", "layer ms", "host ms", "host share",
                "bound at"):
        t.add_column(col, justify="left" if col in ("row", "model", "gpu", "AC") else "right")
    for r in rows:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        t.add_row(r["row_id"], r["model"][:16], r["gpu"], str(r["seq_len"]), str(r["micro_batch"]), r["recompute"],
                  err, f"{r['layer_compute_s'] * 1e3:.2f}", f"{r['layer_host_s'] * 1e3:.3f}",
                  f"{r['host_share']:.1%}",
                  "-" if r["host_bound_at_s_per_kernel"] is None else f"{r['host_bound_at_s_per_kernel'] * 1e6:.0f} us")
    con.print(t)
    s = Table(title="Median signed throughput error (rows) by sequence length and host share")
    for col in ("group", "seq <= 2048", "4096-8192", ">= 16384", "all"):
        s.add_column(col, justify="left" if col == "group" else "right")
    bands = (lambda r: r["seq_len"] <= 2048, lambda r: 4096 <= r["seq_len"] <= 8192, lambda r: r["seq_len"] >= 16384)
    for name, pick in (("host share < 2%", lambda r: r["host_share"] < 0.02),
                       ("host share >= 2%", lambda r: r["host_share"] >= 0.02)):
        group = [r for r in rows if pick(r)]
        s.add_row(name, *(_median([r for r in group if b(r)]) for b in bands), _median(group))
    con.print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
