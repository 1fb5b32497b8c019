"""The worst Blackwell rows of the Megatron-Bridge tables, each with its step split into terms
(a bench, not a test; issue 14 items 2-3).

    PYTHONPATH=src python bench/bench_blackwell_rows.py            # 20 worst b200/b300/gb200/gb300 rows
    PYTHONPATH=src python bench/bench_blackwell_rows.py --top 40 --json
    PYTHONPATH=src python bench/bench_blackwell_rows.py --model gpt-oss   # one model's rows

For every row, as ``meshplan validate --runs megatron-bridge`` estimates it: the signed error,
then the predicted step as shares of itself:

* from the estimate's own breakdown (cost/step.py ``TimeBreakdown.terms_s``): exposed EP
  (dispatch + combine), exposed TP/CP, exposed PP p2p, exposed DP (and per-micro-batch ZeRO),
  the pipeline bubble, the optimizer;
* inside the compute term, by ablation of one Calibration field at a time (the step's change
  when the term's time is removed or halved, so a term hidden behind another reads small):
  GEMM (matmul efficiency halved: the step's growth), attention (attention efficiency halved:
  likewise), MoE permutation (``moe_permute_passes`` 0), the dropless
  all-to-all's host sync (``moe_alltoall_sync_s`` 0), host launches and fixed per-layer /
  per-micro-batch costs (``host_s_per_kernel``, ``layer_overhead_s``, ``microbatch_overhead_s`` 0).

The last table groups the rows by what they share (GPU, MoE dispatcher, host sync charged, CUDA
graphs, whether the EP group leaves the 8-GPU node) with the median signed error per group.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import (
    Run,
    load_runs,
    predicted_metric,
    setting_calibration,
)
from meshplan.cost.calibration import Calibration
from meshplan.cost.step import estimate
from meshplan.data.published import runs_csv
from meshplan.spec.training import MoeDispatcher

BLACKWELL_GPUS = ("b200", "b300", "gb200", "gb300")
ABLATIONS: dict[str, tuple[dict[str, Any], float]] = {
    # term: fields to set (those in SCALED: to the calibration's value times this)
    "GEMM": {"matmul_efficiency": 0.5},
    "attention": {"attention_efficiency": 0.5},
    "permutation": {"moe_permute_passes": 0.0},
    "MoE host sync": {"moe_alltoall_sync_s": 0.0},
    "host/launch": {"host_s_per_kernel": 0.0, "layer_overhead_s": 0.0, "microbatch_overhead_s": 0.0},
}
SCALED = frozenset({"matmul_efficiency", "attention_efficiency"})
"""Fields an ablation halves: the step grows by the term's time (the others it zeroes: the step
shrinks by it)."""
BREAKDOWN_TERMS = ("exposed EP", "exposed TP", "exposed CP", "exposed PP p2p", "exposed DP",
                   "exposed ZeRO per micro-batch", "collective host overhead", "bubble", "optimizer")


def _calib(run: Run) -> Calibration:
    return setting_calibration(run, None, {**run.settings, **run.release_values})


def _step_s(run: Run, calib: Calibration) -> float:
    return estimate(run.model, run.cluster, run.training, run.plan, calib).step_time_s


def row_terms(run: Run) -> dict[str, Any]:
    """The row's error and its predicted step's terms as shares of the step (module docstring)."""
    calib = _calib(run)
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    step = est.step_time_s
    pred = predicted_metric(run, step)
    terms = est.time.terms_s()
    shares = {k: terms[k] / step for k in BREAKDOWN_TERMS}
    for name, fields in ABLATIONS.items():
        changed = {f: getattr(calib, f) * v if f in SCALED else v for f, v in fields.items()}
        shares[name] = abs(step - _step_s(run, calib.replace_fields(**changed))) / step
    sync = (run.model.is_moe and calib.moe_alltoall_sync_s > 0 and not calib.cuda_graph_full_iteration
            and run.training.moe_capacity_factor is None
            and run.training.moe_dispatcher == MoeDispatcher.ALLTOALL)
    return {"row_id": run.row_id, "source": run.source, "model": run.model.name, "gpu": run.cluster.gpu.name,
            "precision": run.training.precision.value, "plan": run.plan.notation(),
            "error": None if pred is None or not run.measured else pred / run.measured - 1.0,
            "dispatcher": run.training.moe_dispatcher.value if run.model.is_moe else "-",
            "host_sync_charged": bool(sync), "cuda_graph_full_iteration": calib.cuda_graph_full_iteration,
            "ep_beyond_node": bool(run.model.is_moe and run.plan.dims.ep > run.cluster.gpus_per_node),
            "shares": shares}


def _group_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Blackwell rows by shared mechanism: median signed error")
    for col in ("by", "group", "rows", "median signed", "median |error|"):
        t.add_column(col, justify="left" if col in ("by", "group") else "right")
    keys = {"gpu": lambda r: r["gpu"], "moe dispatcher": lambda r: r["dispatcher"],
            "host sync charged": lambda r: str(r["host_sync_charged"]),
            "full-iteration CUDA graph": lambda r: str(r["cuda_graph_full_iteration"]),
            "EP beyond the 8-GPU node": lambda r: str(r["ep_beyond_node"]),
            "precision": lambda r: r["precision"]}
    for by, key in keys.items():
        groups: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if r["error"] is not None:
                groups[key(r)].append(r["error"])
        for g, errs in sorted(groups.items()):
            t.add_row(by, g, str(len(errs)), f"{np.median(errs):+.1%}", f"{np.median(np.abs(errs)):.1%}")
    return t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=20, help="rows to list, worst first")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--model", default="", help="only rows whose model name contains this")
    args = ap.parse_args(argv)
    runs, _ = load_runs(runs_csv("megatron-bridge"))
    rows = [row_terms(r) for r in runs if r.cluster.gpu.name in BLACKWELL_GPUS and args.model in r.model.name]
    worst = sorted((r for r in rows if r["error"] is not None), key=lambda r: -abs(r["error"]))[:args.top]
    if args.json:
        json.dump({"worst": worst, "all": rows}, sys.stdout, indent=1)
        return 0
    con = Console(width=250)
    t = Table(title=f"{len(worst)} worst Blackwell rows: the predicted step as shares of itself")
    cols = ("id", "model", "gpu", "prec", "error", "disp", "sync", *ABLATIONS, "exp EP", "exp TP+CP",
            "exp PP", "exp DP", "bubble")
    for c in cols:
        t.add_column(c, justify="left" if c in ("id", "model", "gpu", "prec", "disp") else "right")
    for r in worst:
        s = r["shares"]
        t.add_row(r["row_id"], r["model"], r["gpu"], r["precision"], f"{r['error']:+.1%}", r["dispatcher"],
                  "y" if r["host_sync_charged"] else "", *(f"{s[k]:.0%}" for k in ABLATIONS),
                  f"{s['exposed EP']:.0%}", f"{s['exposed TP'] + s['exposed CP']:.0%}",
                  f"{s['exposed PP p2p']:.0%}",
                  f"{s['exposed DP'] + s['exposed ZeRO per micro-batch']:.0%}", f"{s['bubble']:.0%}")
    con.print(t)
    con.print(_group_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
