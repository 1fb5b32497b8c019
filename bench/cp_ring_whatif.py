"""Would a slower ring step close torchtitan's 8B cp4 / cp8 gap without breaking the 405B series?
(a bench; issue 14, long context on held-out runs)

    PYTHONPATH=src python bench/cp_ring_whatif.py
    PYTHONPATH=src python bench/cp_ring_whatif.py --factors 1 1.5 2 3 --json

torchtitan's CP tables (docs/performance.md, torch 1963fc8 / torchtitan 9dec370) hold two series
that run the same ring (cost/torch_cp.py) at growing c with S/c = 32k tokens a rank: Llama 3.1 8B
(tp1, one node, tt-4..7) and 405B (tp8 pp8, the CP group across nodes, tt-15..18). A term missing
from the ring's later steps (a kernel slower than the table's, lost load balance, a serialising
wait) costs in proportion to the later steps' SDPA time in both. This stretches the later steps'
kernel time by each factor (their efficiency divided by it; step 0 and the dense layers
unchanged) and prints every CP row's throughput error: a factor that fixes tt-6 / tt-7 while
tt-16..18 stay near zero would be a ring term; one that moves the 405B rows as far the other way
says the ring is not where the 8B gap sits. ``--eager`` also costs the ring's collectives as
eager torch waits on them (the K/V gather behind step 0, each dK/dV send behind the next step:
cost/torch_cp.py ``eager``) instead of where a traced graph issues them. Nothing here is fitted
or shipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import evaluate, load_runs
from meshplan.cost import mixers
from meshplan.cost.torch_cp import torch_cp_cost

HERE = Path(__file__).parent
ROWS = ("tt-4", "tt-5", "tt-6", "tt-7", "tt-15", "tt-16", "tt-17", "tt-18")
"""The two CP series and their cp1 anchors (bench/data/runs_heldout.csv)."""


def stretched(factor: float, eager: bool = False):
    """torch_cp_cost with the non-causal (later) steps' kernel efficiency divided by ``factor``;
    ``eager``: the collectives waited at first use whatever the stack."""
    def cost(**kwargs):
        eff = kwargs["efficiency"]
        kwargs["efficiency"] = lambda kv, causal, bwd: eff(kv, causal, bwd) / (1.0 if causal else factor)
        if eager:
            kwargs["eager"] = True
        return torch_cp_cost(**kwargs)
    return cost


def errors(factor: float, eager: bool = False) -> dict[str, float]:
    runs, _ = load_runs(HERE / "data" / "runs_heldout.csv")
    runs = [r for r in runs if r.row_id in ROWS]
    with mock.patch.object(mixers, "torch_cp_cost", stretched(factor, eager)):
        report = evaluate(runs, [])
    return {r.row_id: r.error for r in report.rows}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--eager", action="store_true", help="collectives waited at first use (module docstring)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = {f: errors(f, args.eager) for f in args.factors}
    if args.json:
        print(json.dumps({str(f): e for f, e in table.items()}, indent=1))
        return 0
    t = Table(title="CP rows' throughput error (+ = predicted too fast) with the later ring steps' kernels "
                    "stretched by each factor" + (", collectives waited at first use" if args.eager else ""))
    t.add_column("row")
    for f in args.factors:
        t.add_column(f"x{f:g}", justify="right")
    for rid in ROWS:
        t.add_row(rid, *(f"{table[f].get(rid, float('nan')) * 100:+.1f}%" for f in args.factors))
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
