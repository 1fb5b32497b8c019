"""Held-out throughput error by GPU, stack and sequence length, before / after a change (a bench).

    PYTHONPATH=src python -m meshplan validate --runs bench/data/runs_heldout.csv --json > after.json
    (the same from a checkout before the change > before.json)
    PYTHONPATH=src python bench/heldout_by_seq.py before.json after.json [--json]

Median signed throughput error (predicted / measured - 1) per (GPU, stack, sequence bucket) on
the rows both reports estimated. The rows only check a change: nothing is fitted on them.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent
RUNS = HERE / "data" / "runs_heldout.csv"
SEQ_BUCKETS = ((2048, "<=2k"), (8192, "4k-8k"), (float("inf"), ">=16k"))
"""The buckets of docs/accuracy.md's held-out finding (sequence lengths of the published rows)."""


def seq_bucket(seq_len: float) -> str:
    return next(name for top, name in SEQ_BUCKETS if seq_len <= top)


def errors_by_group(report: dict, seq_by_id: dict[str, float]) -> dict[tuple[str, str, str], list[float]]:
    out: dict[tuple[str, str, str], list[float]] = {}
    for r in report["rows"]:
        if r["error"] is not None and r["row_id"] in seq_by_id:
            key = (r["gpu"], r["stack"], seq_bucket(seq_by_id[r["row_id"]]))
            out.setdefault(key, []).append(r["error"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with args.runs.open() as fh:
        seq_by_id = {row["id"]: float(row["seq_len"]) for row in csv.DictReader(fh) if row["seq_len"]}
    before = errors_by_group(json.loads(args.before.read_text()), seq_by_id)
    after = errors_by_group(json.loads(args.after.read_text()), seq_by_id)
    rows = [{"gpu": g, "stack": s, "seq": b, "rows": len(after[(g, s, b)]),
             "before_median_signed": statistics.median(before.get((g, s, b), [float("nan")])),
             "after_median_signed": statistics.median(after[(g, s, b)])}
            for (g, s, b) in sorted(after, key=lambda k: (k[0], k[1], [n for _, n in SEQ_BUCKETS].index(k[2])))]
    con = Console(highlight=False)
    if args.json:
        con.print_json(data=rows)
        return
    t = Table(title="held-out throughput, median signed error")
    for col in ("gpu", "stack", "seq", "rows", "before", "after"):
        t.add_column(col, justify="left" if col in ("gpu", "stack", "seq") else "right")
    for r in rows:
        t.add_row(r["gpu"], r["stack"], r["seq"], str(r["rows"]), f"{r['before_median_signed']:+.1%}",
                  f"{r['after_median_signed']:+.1%}")
    con.print(t)


if __name__ == "__main__":
    main()
