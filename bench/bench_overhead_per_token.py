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
import copy
import json
import sys
import time
from pathlib import Path

from meshplan.calib.fit import PER_TOKEN_GRID, TIME_GRID, calibration_key, fit_rows, fit_start, shared_settings
from meshplan.calib.records import fitted_file
from meshplan.calib.validate import load_runs
from meshplan.data.published import PUBLISHED_RUNS
from meshplan.shipped import shipped_path

FIELDS = {"matmul_efficiency": TIME_GRID["matmul_efficiency"],
          "layer_overhead_s": TIME_GRID["layer_overhead_s"], **PER_TOKEN_GRID}
KEYS = ("blackwell/megatron", "blackwell-ultra/megatron", "hopper/megatron")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on-host", action="store_true", help="the megatron stack's layer_overhead_on_host on")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    runs, _ = load_runs(shipped_path("meshplan.data", PUBLISHED_RUNS["megatron-bridge"]))
    shipped = json.loads(fitted_file().read_text())
    out = copy.deepcopy(shipped)
    if args.on_host:
        out["stacks"]["megatron"]["values"]["layer_overhead_on_host"] = True
    flag = {"layer_overhead_on_host": True} if args.on_host else {}
    for key in KEYS:
        rows = [r for r in runs if calibration_key(r) == key]
        kept = {k: v for k, v in shipped["records"][key]["values"].items() if k not in FIELDS}
        settings = {**shared_settings(rows, {}), **kept, **flag}
        began = time.process_time()
        res = fit_rows(rows, key, rows[0].stack, settings, rounds=3, time_grid=FIELDS, memory_grid={},
                       restarts=1, warm={k: v for k, v in shipped["records"][key]["values"].items() if k in FIELDS})
        start = fit_start(rows[0].stack, settings, generation=key.split("/")[0])
        values = {k: res.values.get(k, getattr(start, k)) for k in FIELDS}
        out["records"][key]["values"] = {**kept, **values}
        print(f"{key}: {len(rows)} rows, median |err| {res.throughput_error_after:.2%}, "
              + ", ".join(f"{k}={v:g}" for k, v in values.items())
              + f" ({time.process_time() - began:.0f} CPU s)", flush=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
