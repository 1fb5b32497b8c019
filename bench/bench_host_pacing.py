"""Host pacing by kernel count: a restricted refit of the Megatron-Bridge records.

A layer's host time is its kernels times a per-launch cost (cost/host.py), the kernels counted
from what the layer runs (``Calibration.host_kernels_by_op``: the quantize kernels of each fp8 /
fp4 GEMM operand per recipe, the MoE block's router / dispatcher / expert kernels), paced
against the device (max of the two, PyTorch 'Asynchronous execution'). Per (generation,
megatron) record of the shipped calibration, refit only ``matmul_efficiency``,
``layer_overhead_s``, ``host_s_per_kernel`` (and with ``--factor`` the per-token
``elementwise_time_factor``), every other field at its shipped value, with the megatron stack's
flags as given:

    PYTHONPATH=src python bench/bench_host_pacing.py --by-op --on-host --out /tmp/pacing.json

then copy ``--out`` over spec/presets/calibration_fitted.json and ``meshplan validate --runs
megatron-bridge --json`` for the figures (pairwise included). ~5-10 CPU min.
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

HOST_GRID = (2e-6, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 40e-6)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--by-op", action="store_true", help="the megatron stack's host_kernels_by_op on")
    ap.add_argument("--on-host", action="store_true", help="the megatron stack's layer_overhead_on_host on")
    ap.add_argument("--factor", action="store_true", help="elementwise_time_factor free too")
    ap.add_argument("--no-overhead", action="store_true", help="layer_overhead_s held at 0")
    ap.add_argument("--free", nargs="*", default=[], help="more TIME_GRID fields to refit")
    ap.add_argument("--moe-block", action="store_true", help="count the MoE block's kernels too")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    fields = {"matmul_efficiency": TIME_GRID["matmul_efficiency"], "host_s_per_kernel": HOST_GRID}
    if not args.no_overhead:
        fields["layer_overhead_s"] = TIME_GRID["layer_overhead_s"]
    if args.factor:
        fields.update(PER_TOKEN_GRID)
    fields.update({k: TIME_GRID[k] for k in args.free})
    runs, _ = load_runs(shipped_path("meshplan.data", PUBLISHED_RUNS["megatron-bridge"]))
    shipped = json.loads(fitted_file().read_text())
    flag = {}
    if args.on_host:
        flag["layer_overhead_on_host"] = True
    if args.by_op:
        flag["host_kernels_by_op"] = True
    if args.moe_block:
        flag["host_moe_block_kernels"] = True
    out = refit_records(shipped, runs, fields, flag, {"layer_overhead_s": 0.0} if args.no_overhead else None)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
