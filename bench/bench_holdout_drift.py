"""Why leave-one-family-out fails: which fitted constants move when a model family is held out,
and how much of the held-out rows' error each move explains (a bench, not a test).

    PYTHONPATH=src python bench/bench_holdout_drift.py                     # megatron-bridge
    PYTHONPATH=src python bench/bench_holdout_drift.py --runs calibration --by generation --json

For every held-out group and every (generation, stack) record its rows use, it prints each fitted
value of the fit on all rows beside the fit without the group, and the held-out rows' median
signed throughput error three ways: under the fit on all rows (in-sample), under the fit without
the group (out-of-sample), and with that one constant put back to its all-rows value (the
constant's share of the drift). Writes bench/results/holdout_drift_<by>_<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from meshplan.calib.fit import FIT_ROUNDS, calibration_key, fit_all, fitted_calibration, predict_all, prepare
from meshplan.calib.holdout import HOLDOUTS
from meshplan.calib.validate import Run, load_runs
from meshplan.data.published import runs_csv

HERE = Path(__file__).parent


def signed_errors(rows: list[Run], calib_of) -> np.ndarray:
    """predicted / measured - 1 of ``rows``, each under ``calib_of(row)``."""
    out = []
    for r in rows:
        pred, _ = predict_all(prepare([r]), calib_of(r))
        out.append(pred[0] / r.measured - 1.0)
    return np.array(out)


def drift(runs: list[Run], by: str, rounds: int, specific_first: bool = False) -> list[dict]:
    rows = [r for r in runs if r.metric and r.measured]
    full = fit_all(rows, {}, rounds, memory_grid={}, specific_first=specific_first)
    group_of = HOLDOUTS[by]
    out = []
    for g in sorted({group_of(r) for r in rows}):
        train = [r for r in rows if group_of(r) != g]
        held = fit_all(train, {}, rounds, memory_grid={}, specific_first=specific_first)
        for key in sorted({calibration_key(r) for r in rows if group_of(r) == g}):
            test = [r for r in rows if group_of(r) == g and calibration_key(r) == key]
            if key not in held:
                out.append({"group": g, "key": key, "rows": len(test), "note": "no training rows left"})
                continue
            fa, fh = full[key], held[key]
            e_in = signed_errors(test, lambda r: fitted_calibration(r, full))
            e_out = signed_errors(test, lambda r: fitted_calibration(r, held))
            moved = []
            for name in sorted(set(fa.values) | set(fh.values)):
                start = fitted_calibration(test[0], held)
                a = fitted_calibration(test[0], full)
                if getattr(a, name) == getattr(start, name):
                    continue
                back = signed_errors(test, lambda r, n=name: fitted_calibration(r, held).replace_fields(
                    **{n: getattr(fitted_calibration(r, full), n)}))
                moved.append({"field": name, "all_rows": getattr(a, name), "held_out": getattr(start, name),
                              "signed_if_put_back": float(np.median(back))})
            out.append({"group": g, "key": key, "rows": len(test),
                        "signed_in_sample": float(np.median(e_in)), "signed_held_out": float(np.median(e_out)),
                        "abs_in_sample": float(np.median(np.abs(e_in))),
                        "abs_held_out": float(np.median(np.abs(e_out))), "moved": moved})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="megatron-bridge")
    ap.add_argument("--by", default="family", choices=sorted(HOLDOUTS))
    ap.add_argument("--rounds", type=int, default=FIT_ROUNDS, help="coordinate-descent rounds (the fit's)")
    ap.add_argument("--specific-first", action="store_true",
                    help="sweep the MoE / Mamba / fp8-fp4 fields first (calib/fit.py SPECIFIC_FIELDS)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs, _ = load_runs(runs_csv(args.runs))
    res = drift(runs, args.by, args.rounds, args.specific_first)
    HERE.joinpath("results").mkdir(exist_ok=True)
    path = HERE / "results" / f"holdout_drift_{args.by}_{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(res, indent=1))
    if args.json:
        Console().print_json(json.dumps(res))
        return 0
    con = Console(width=160)
    for item in res:
        title = (f"{args.by} {item['group']} held out, {item['key']} ({item['rows']} rows): "
                 + (item.get("note") or f"median signed {item['signed_in_sample']:+.1%} in-sample -> "
                    f"{item['signed_held_out']:+.1%} held out (|err| {item['abs_in_sample']:.1%} -> "
                    f"{item['abs_held_out']:.1%})"))
        t = Table(title=title)
        for col in ("field", "all rows", "held out", "held-out signed with this one put back"):
            t.add_column(col, justify="left" if col == "field" else "right")
        for m in item.get("moved", ()):
            t.add_row(m["field"], f"{m['all_rows']:.4g}", f"{m['held_out']:.4g}", f"{m['signed_if_put_back']:+.1%}")
        con.print(t)
    con.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
