"""Fidelity on published runs that no calibration was fitted on (a bench, not a test).

    PYTHONPATH=src python bench/bench_heldout.py            # bench/data/runs_heldout.csv
    PYTHONPATH=src python bench/bench_heldout.py --runs my_runs.csv --json
    PYTHONPATH=src python bench/bench_heldout.py --before old_summary.json   # + before / after by GPU, framework, precision

Runs ``meshplan validate --runs <csv> --json`` through the real entry point (the estimate any user
gets for those rows) and prints the median and 90th-percentile absolute throughput and memory
error, the median signed error by stack, by GPU, by source and by whether the row's ZeRO-3 / FSDP
group spans nodes, and the rows skipped with their reasons. The held-out CSV is the generalization
check of issue 14: its rows are never used to fit anything (bench/fit_calibration.py reads the
shipped CSVs only), so these figures are the honest error on stacks and teams the fit has not seen.
Writes bench/results/heldout_<date>.json; ``--before`` takes such a file from an earlier checkout
(``git show REV:bench/results/heldout_<date>.json``) and adds the median signed and absolute error
per GPU, framework and precision before and after.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent
DEFAULT_RUNS = HERE / "data" / "runs_heldout.csv"


def validate_json(runs: Path) -> dict[str, Any]:
    """``meshplan validate --runs runs --json`` as a subprocess (the CLI's own path, errors included)."""
    out = subprocess.run([sys.executable, "-m", "meshplan", "validate", "--runs", str(runs), "--json"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"meshplan validate failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return json.loads(out.stdout)


def fsdp_across_nodes(row: dict[str, str]) -> bool:
    """Whether the row's ZeRO-3 group spans nodes: ranks are laid out tp, cp, dp from the fastest
    (Megatron's and torchtitan's mesh order), so the group of tp*cp*dp consecutive ranks leaves the
    node when it is larger than the node."""
    def n(key: str, default: int) -> int:
        return int(float(row.get(key) or default))
    group = n("tp", 1) * n("cp", 1) * n("dp", 1)
    return n("zero", 0) == 3 and n("dp", 1) > 1 and group > n("gpus_per_node", 8)


def _stats(values: list[float]) -> dict[str, float]:
    a = np.array(values, dtype=float)
    if not a.size:
        return {"rows": 0}
    return {"rows": int(a.size), "median_abs_error": float(np.median(np.abs(a))),
            "p90_abs_error": float(np.percentile(np.abs(a), 90)), "median_signed_error": float(np.median(a))}


def seq_bucket(row: dict[str, str]) -> str:
    """The row's sequence length as a bucket: up to 8k, 16-32k, 64k and longer."""
    seq = int(float(row["seq_len"]))
    return "<=8k" if seq <= 8192 else "16k-32k" if seq <= 32768 else ">=64k"


def grouped(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], str], metric: str) -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r[metric] is not None:
            groups.setdefault(key(r), []).append(r[metric])
    return {g: _stats(v) for g, v in sorted(groups.items())}


def summarise(report: dict[str, Any], csv_rows: dict[str, dict[str, str]]) -> dict[str, Any]:
    rows = report["rows"]
    keys: dict[str, Callable[[dict[str, Any]], str]] = {
        "stack": lambda r: r["stack"],
        "framework": lambda r: csv_rows[r["row_id"]].get("framework") or "unstated",
        "fsdp_across_nodes": lambda r: "FSDP across nodes" if fsdp_across_nodes(csv_rows[r["row_id"]]) else "not",
        "gpu": lambda r: r["gpu"],
        "precision": lambda r: r["precision"],
        "source": lambda r: csv_rows[r["row_id"]]["source"].split()[0],
        "memory_basis": lambda r: r.get("memory_basis", "reserved"),
        "seq_len": lambda r: seq_bucket(csv_rows[r["row_id"]]),
        "cp": lambda r: f"cp{int(float(csv_rows[r['row_id']].get('cp') or 1))}",
    }
    return {
        "throughput": _stats([r["error"] for r in rows if r["error"] is not None]),
        "memory": _stats([r["memory_error"] for r in rows if r["memory_error"] is not None]),
        "memory_optimistic_rows": report["summary"].get("memory_optimistic_rows"),
        "throughput_by": {k: grouped(rows, f, "error") for k, f in keys.items()},
        "memory_by": {k: grouped(rows, f, "memory_error") for k, f in keys.items()},
        "rows": len(rows), "skipped": len(report["skipped"]),
        "skipped_reasons": dict(Counter(s["reason"] for s in report["skipped"]).most_common()),
    }


def _show(con: Console, title: str, by: dict[str, dict[str, dict[str, float]]]) -> None:
    t = Table(title=title)
    for col in ("by", "group", "rows", "median signed", "median |err|", "p90 |err|"):
        t.add_column(col, justify="left" if col in ("by", "group") else "right")
    for name, groups in by.items():
        for g, s in groups.items():
            t.add_row(name, g, str(s["rows"]), f"{s['median_signed_error']:+.1%}", f"{s['median_abs_error']:.1%}",
                      f"{s['p90_abs_error']:.1%}")
    con.print(t)


COMPARED = ("gpu", "framework", "precision", "seq_len", "cp")
"""The groups a before / after table shows (issue 14's held-out report)."""


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group of ``COMPARED`` (and overall): rows and the median signed / absolute throughput
    error of two summaries (``summarise``'s output); a group one summary lacks has None there."""
    out = [{"by": "all", "group": "all", "before": before["throughput"], "after": after["throughput"]}]
    for by in COMPARED:
        b, a = before["throughput_by"].get(by, {}), after["throughput_by"].get(by, {})
        out += [{"by": by, "group": g, "before": b.get(g), "after": a.get(g)} for g in sorted(set(b) | set(a))]
    return out


def _show_compare(con: Console, rows: list[dict[str, Any]]) -> None:
    t = Table(title="Throughput error before / after (median signed; median |err|)")
    for col in ("by", "group", "rows", "before", "after"):
        t.add_column(col, justify="left" if col in ("by", "group") else "right")

    def cell(s: dict[str, Any] | None) -> str:
        return "-" if not s or not s.get("rows") else f"{s['median_signed_error']:+.1%}; {s['median_abs_error']:.1%}"
    for r in rows:
        n = "/".join(str((r[k] or {}).get("rows", 0)) for k in ("before", "after"))
        t.add_row(r["by"], r["group"], n, cell(r["before"]), cell(r["after"]))
    con.print(t)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    ap.add_argument("--before", type=Path, help="a summary JSON of an earlier checkout to compare with")
    args = ap.parse_args(argv)
    with args.runs.open(newline="") as f:
        csv_rows = {r["id"]: r for r in csv.DictReader(f)}
    out = summarise(validate_json(args.runs), csv_rows)
    out["runs"] = str(args.runs)
    path = HERE / "results" / f"heldout_{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    comparison = compare(json.loads(args.before.read_text()), out) if args.before else None
    if args.json:
        print(json.dumps({**out, "compared": comparison} if comparison else out, indent=1))
        return 0
    con = Console(width=110)
    t = Table(title=f"Held-out published runs: {args.runs.name} ({out['rows']} estimated, {out['skipped']} skipped)")
    for col in ("quantity", "rows", "median |err|", "p90 |err|", "median signed"):
        t.add_column(col, justify="left" if col == "quantity" else "right")
    for q in ("throughput", "memory"):
        s = out[q]
        if s["rows"]:
            t.add_row(q, str(s["rows"]), f"{s['median_abs_error']:.1%}", f"{s['p90_abs_error']:.1%}",
                      f"{s['median_signed_error']:+.1%}")
    con.print(t)
    con.print(f"memory rows predicted > 5% below the measurement: {out['memory_optimistic_rows']}")
    _show(con, "Throughput error (predicted / measured - 1)", out["throughput_by"])
    _show(con, "Peak memory error (predicted / measured - 1)", out["memory_by"])
    if comparison:
        _show_compare(con, comparison)
    for reason, n in out["skipped_reasons"].items():
        con.print(f"skipped {n}: {reason}")
    con.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
