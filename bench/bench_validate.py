"""Fidelity on the shipped published runs, against issue 14's targets (a bench, not a test).

    PYTHONPATH=src python bench/bench_validate.py              # plain scores, held-out scores
    PYTHONPATH=src python bench/bench_validate.py --quick      # plain scores only (seconds)

For each CSV: the median and p90 absolute throughput error under the shipped calibration (per
(GPU generation, stack), spec/presets/calibration_fitted.json), the median signed error per
precision, dense/MoE and GPU, and (without --quick) the leave-one-model-family-out and
leave-one-GPU-generation-out scores (calib/holdout.py: refit without the group, score it).
Writes bench/results/validate_<date>.json.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshplan.calib.holdout import leave_one_out
from meshplan.calib.validate import evaluate, load_runs
from meshplan.data.published import runs_csv

TARGETS = {
    # (runs, quantity): the bound issue 14 sets
    ("megatron-bridge", "throughput_median_abs_error"): 0.08,
    ("megatron-bridge", "throughput_p90_abs_error"): 0.20,
    ("megatron-bridge", "leave_one_family_out_median_abs_error"): 0.12,
    ("megatron-bridge", "max_abs_median_signed_error_precision_dense_moe"): 0.05,
    ("calibration", "throughput_median_abs_error"): 0.058,
    ("calibration", "memory_median_abs_error"): 0.029,
}


def score(name: str, holdouts: bool) -> dict:
    runs, skipped = load_runs(runs_csv(name))
    report = evaluate(runs, skipped)
    out = {**report.summary(), "signed_error_by": report.breakdown()}
    signed = [v["median_signed_error"] for k in ("precision", "dense_moe")
              for v in out["signed_error_by"][k].values()]
    out["max_abs_median_signed_error_precision_dense_moe"] = max(abs(s) for s in signed)
    if holdouts:
        for by in ("family", "generation"):  # each fit from its rows' frameworks' settings
            h = leave_one_out(runs, by, {}).summary()
            out[f"leave_one_{by}_out"] = h
            out[f"leave_one_{by}_out_median_abs_error"] = h["median_abs_error"]
    return out


def main(argv: list[str]) -> int:
    holdouts = "--quick" not in argv
    con = Console()
    results = {name: score(name, holdouts) for name in ("megatron-bridge", "calibration")}
    t = Table(title="Fidelity on the shipped published runs (issue 14 targets)")
    for col in ("runs", "quantity", "value", "target", "met"):
        t.add_column(col, justify="right" if col in ("value", "target") else "left")
    for (name, q), bound in TARGETS.items():
        v = results[name].get(q)
        t.add_row(name, q, "" if v is None else f"{v:.1%}", f"{bound:.1%}",
                  "" if v is None else ("yes" if v <= bound + 5e-4 else "no"))
    con.print(t)
    for name, r in results.items():
        b = Table(title=f"{name}: median signed error (predicted / measured - 1)")
        for col in ("by", "group", "rows", "signed", "|error|"):
            b.add_column(col)
        for by in ("precision", "dense_moe", "generation", "gpu", "family"):
            for g, v in r["signed_error_by"][by].items():
                b.add_row(by, g, str(v["rows"]), f"{v['median_signed_error']:+.1%}", f"{v['median_abs_error']:.1%}")
        for by in ("family", "generation"):
            h = r.get(f"leave_one_{by}_out")
            for g, v in (h or {}).get("groups", {}).items():
                b.add_row(f"held out ({by})", g, str(v["rows"]), f"{v['median_signed_error']:+.1%}",
                          f"{v['median_abs_error']:.1%}")
        con.print(b)
    path = Path(__file__).parent / "results" / f"validate_{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(results, indent=1, default=float) + "\n")
    con.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
