"""What the per-layer device overhead stands in for: a restricted refit of the Megatron-Bridge records.

Per (generation, megatron) record of the shipped calibration, refit only ``matmul_efficiency``,
``layer_overhead_s`` and the per-token memory-bound factor ``elementwise_time_factor``
(calib/fit.py ``PER_TOKEN_GRID``, range in calib/priors.py), every other field kept at its shipped
value, with the megatron stack's ``layer_overhead_on_host`` on or off. A per-layer, per-micro-batch
device cost and a per-token one differ exactly where the micro-batch changes: the measured
micro-batch pairs (calib/pairwise.py) separate them.

    PYTHONPATH=src python bench/bench_overhead_per_token.py --on-host --out /tmp/per_token.json
    PYTHONPATH=src python bench/bench_overhead_per_token.py --out /tmp/per_layer.json

Prints each record's fitted values and its median error; writes the whole calibration file to
``--out`` (copy it over spec/presets/calibration_fitted.json, then ``meshplan validate --runs
megatron-bridge --json`` for the figures, pairwise included). ~4 CPU min per flag.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshplan.calib.fit import PER_TOKEN_GRID, TIME_GRID
from meshplan.calib.records import fitted_file
from meshplan.calib.validate import load_runs
from meshplan.data.published import PUBLISHED_RUNS
from meshplan.shipped import shipped_path
from restricted_refit import refit_records

FIELDS = {"matmul_efficiency": TIME_GRID["matmul_efficiency"],
          "layer_overhead_s": TIME_GRID["layer_overhead_s"], **PER_TOKEN_GRID}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on-host", action="store_true", help="the megatron stack's layer_overhead_on_host on")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    runs, _ = load_runs(shipped_path("meshplan.data", PUBLISHED_RUNS["megatron-bridge"]))
    shipped = json.loads(fitted_file().read_text())
    flag = {"layer_overhead_on_host": True} if args.on_host else {}
    out = refit_records(shipped, runs, FIELDS, flag)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
