"""Published plans that offload the activations of a count of layers (Megatron-Core's
``cpu_offloading_num_layers``) against the search's recommendation for the same job (issue 15,
session 13: docs/search.md "Session 13: offload13").

    PYTHONPATH=src python bench/offload_counts.py            # the Bridge rows that offload activations
    PYTHONPATH=src python bench/offload_counts.py 349 544    # some rows
    PYTHONPATH=src python bench/offload_counts.py --json

Per row, as bench/bench_experts.py builds the job (the row's calibration, ``--target megatron``'s
search options): the published plan's estimate (step, GPU peak, host memory), the same plan
offloading every layer but one (the most Megatron offloads: what a search of whole choices would
have scored, and whether the host holds it), and the search's nominally fastest plan that fits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experts_evidence import _runs_by_id, run_calibration  # noqa: E402

GIB = 2**30


def row_figures(run) -> dict:
    from meshplan.cost import estimate
    from meshplan.cost.offload import host_budget_bytes
    from meshplan.search.planner import search
    from meshplan.targets import Target, search_options

    calib = run_calibration(run)
    opts = search_options(Target.MEGATRON, run.model, run.training)
    start = time.process_time()
    res = search(run.model, run.cluster, run.training, calib=calib, options=opts)
    cpu_s = time.process_time() - start
    pub = estimate(run.model, run.cluster, run.training, run.plan, calib)
    most = estimate(run.model, run.cluster, run.training,
                    replace(run.plan, offload_layers=run.model.num_layers - 1), calib)
    rec = res.recommended
    return dict(row=run.row_id, model=run.model.name, gpus=f"{run.cluster.num_gpus} x {run.cluster.gpu.name}",
                budget_gib=res.budget_bytes / GIB, host_cap_gib=host_budget_bytes(run.cluster) / GIB,
                published=run.plan.notation(), published_s=pub.step_time_s, published_gib=pub.fit_memory_gib,
                published_host_gib=pub.host_memory_gib, most_layers=run.model.num_layers - 1,
                most_gib=most.fit_memory_gib, most_host_gib=most.host_memory_gib,
                recommended=None if rec is None else rec.plan.notation(),
                recommended_s=None if rec is None else rec.step_time_s,
                recommended_gib=None if rec is None else rec.peak_memory_bytes / GIB,
                nominal_ratio=None if rec is None else pub.step_time_s / rec.step_time_s, search_cpu_s=cpu_s)


def main(argv: list[str]) -> int:
    from meshplan.data.published import PUBLISHED_RUNS
    from meshplan.plan import Offload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="*",
                    help="row ids of the megatron-bridge set (default: every row offloading activations)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    csv = next(c for c in PUBLISHED_RUNS if "bridge" in c)
    runs = _runs_by_id(csv)
    ids = args.rows or [i for i, r in runs.items() if Offload.ACTIVATIONS in r.plan.offload]
    unknown = [i for i in ids if i not in runs]
    if unknown:
        print(f"no megatron-bridge row {unknown[0]!r}", file=sys.stderr)
        return 2
    out = [row_figures(runs[i]) for i in ids]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in out:
        print(f"row {r['row']} {r['model']} {r['gpus']}: budget {r['budget_gib']:.1f} GiB,"
              f" host {r['host_cap_gib']:.1f} GiB/GPU; search {r['search_cpu_s']:.2f} s CPU")
        print(f"  published   {r['published']}: {r['published_s']:.3f} s, {r['published_gib']:.1f} GiB,"
              f" host {r['published_host_gib']:.1f} GiB")
        print(f"  most        same plan offloading {r['most_layers']} layers: {r['most_gib']:.1f} GiB,"
              f" host {r['most_host_gib']:.1f} GiB")
        if r["recommended"] is None:
            print("  recommended: nothing fits")
        else:
            print(f"  recommended {r['recommended']}: {r['recommended_s']:.3f} s, {r['recommended_gib']:.1f} GiB;"
                  f" published / recommended {r['nominal_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
