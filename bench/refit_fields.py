"""A restricted refit of named fields only: per (generation, megatron) record of the shipped
calibration (bench/restricted_refit.py), refit ``--fields`` over their TIME_GRID grids, every other
field kept at its shipped value. What a full refit would move, one mechanism group at a time
(session 12: the expert all-to-all overlap once DeepSeek-V3's dispatch is dated per release).

    PYTHONPATH=src python bench/refit_fields.py --fields ep_overlap moe_alltoall_sync_s --out /tmp/ep.json
    PYTHONPATH=src python bench/refit_fields.py --fields all --except layer_overhead_s --out /tmp/no_lo.json
    PYTHONPATH=src python bench/refit_fields.py --fields moe_expert_gemm_s --keys hopper/megatron --out /tmp/h.json

Writes the whole calibration file to ``--out``; copy it over spec/presets/calibration_fitted.json and
run ``meshplan validate`` for the figures (pairwise included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshplan.calib.fit import TIME_GRID
from meshplan.calib.records import fitted_file
from meshplan.calib.validate import load_runs
from meshplan.data.published import PUBLISHED_RUNS
from meshplan.shipped import shipped_path
from restricted_refit import KEYS, refit_records


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fields", nargs="+", required=True, choices=["all", *sorted(TIME_GRID)])
    ap.add_argument("--except", dest="exclude", nargs="+", default=[], choices=sorted(TIME_GRID),
                    help="refit every TIME_GRID field but these (with --fields all)")
    ap.add_argument("--keys", nargs="+", default=list(KEYS), choices=KEYS,
                    help="the (generation, megatron) records to refit; the others are kept as shipped")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    runs, _ = load_runs(shipped_path("meshplan.data", PUBLISHED_RUNS["megatron-bridge"]))
    shipped = json.loads(fitted_file().read_text())
    names = [f for f in (TIME_GRID if "all" in args.fields else args.fields) if f not in args.exclude]
    out = refit_records(shipped, runs, {f: TIME_GRID[f] for f in names}, {}, keys=args.keys)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
