"""Leave-one-family-out and leave-one-GPU-generation-out on a shipped set of runs (a bench, not a
test): calib/holdout.py's folds, each refitting the records its held-out rows belong to from the
shipped fit's values by coordinate descent without restarts (what `meshplan validate --holdout`
runs), with the number of sweeps given.

    PYTHONPATH=src python bench/bench_lofo.py                                  # bridge, both
    PYTHONPATH=src python bench/bench_lofo.py --by family --rounds 2 --workers 3

Writes bench/results/lofo_<runs>_<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshplan.calib.fit import FIT_ROUNDS
from meshplan.calib.holdout import leave_one_out
from meshplan.calib.validate import load_runs
from meshplan.data.published import runs_csv

HERE = Path(__file__).parent


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="megatron-bridge")
    ap.add_argument("--by", action="append", choices=("family", "generation", "source"))
    ap.add_argument("--rounds", type=int, default=FIT_ROUNDS, help="sweeps at most per fold's descent")
    ap.add_argument("--workers", type=int, default=1, help="folds at a time (forked processes)")
    args = ap.parse_args(argv)
    runs, _ = load_runs(runs_csv(args.runs))
    out, con = {}, Console(width=150)
    for by in args.by or ("family", "generation"):
        t0 = time.perf_counter()
        s = leave_one_out(runs, by, {}, rounds=args.rounds, workers=args.workers).summary()
        s["wall_s"], s["rounds"] = time.perf_counter() - t0, args.rounds
        out[by] = s
        t = Table(title=f"leave one {by} out ({args.runs}, {args.rounds} sweeps at most, {s['wall_s']:.0f} s): "
                        f"median |err| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}, "
                        f"signed {s['median_signed_error']:+.1%}, median over {by}s "
                        f"{s['median_of_group_medians']:.1%}")
        for col in (by, "rows", "median |err|", "median signed"):
            t.add_column(col, justify="left" if col == by else "right")
        for g, v in s["groups"].items():
            t.add_row(g, str(v["rows"]), f"{v['median_abs_error']:.1%}", f"{v['median_signed_error']:+.1%}")
        con.print(t)
        con.print(s["how"])
    HERE.joinpath("results").mkdir(exist_ok=True)
    path = HERE / "results" / f"lofo_{args.runs}_{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(out, indent=1))
    con.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
