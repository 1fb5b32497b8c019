"""Published Megatron-Bridge runs the estimate puts over the GPU's memory (a bench, not a test).

    PYTHONPATH=src python bench/bench_bridge_budget.py            # count + the rows
    PYTHONPATH=src python bench/bench_bridge_budget.py --json

Every row of runs_megatron_bridge.csv ran, so every row should fit: a row estimated over the
budget is a memory term the estimate gets wrong, or a preset setting (recompute modules,
activation offload; calib/recipes.py) it does not apply. Prints the count, dense and MoE, and
each such row with its plan and the estimated peak against the GPU's memory.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import evaluate, load_runs
from meshplan.data.published import runs_csv


def main(argv: list[str]) -> int:
    runs, skipped = load_runs(runs_csv("megatron-bridge"))
    report = evaluate(runs, skipped)
    gpu_gib = {r.row_id: r.cluster.gpu.memory_gib for r in runs}
    over = [r for r in report.rows if not r.fits]
    summary = {"rows": len(report.rows), "over_budget": len(over),
               "over_budget_moe": sum(r.moe for r in over), "over_budget_dense": sum(not r.moe for r in over),
               "over": [{"id": r.row_id, "model": r.model, "gpu": r.gpu, "plan": r.plan,
                         "predicted_gib": round(r.predicted_memory_gib, 1), "gpu_gib": gpu_gib.get(r.row_id)}
                        for r in over]}
    if "--json" in argv:
        Console().print_json(json.dumps(summary))
        return 0
    table = Table(title=f"{len(over)} of {len(report.rows)} published Megatron-Bridge rows over the budget "
                        f"({summary['over_budget_moe']} MoE)")
    for col in ("row", "model", "gpu", "plan", "estimated GiB", "GPU GiB"):
        table.add_column(col)
    for r in summary["over"]:
        table.add_row(r["id"], r["model"], r["gpu"], r["plan"], f"{r['predicted_gib']:.1f}", str(r["gpu_gib"]))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
