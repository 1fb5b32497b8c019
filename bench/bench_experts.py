"""The search's recommended plan against the configurations experts published (issue 15 item 5).

For every run of the shipped CSVs (``calibration``, ``megatron-bridge``; rows built by
``meshplan.calib.validate``), search the same job (model, GPUs, sequence, batch, precision) for
the run's stack (Megatron: Megatron-LM, Megatron-DeepSpeed and Megatron-Bridge all run the
Megatron-Core layouts) and estimate both plans with the same calibration as ``meshplan validate``.
``ratio`` = published step time / recommended step time under the model (1.34 reads "the search
claims 34% faster"); for every ratio above 1.15 the terms that make the difference
(``meshplan.report.attribution``). Writes docs/experts.md.

    PYTHONPATH=src python bench/bench_experts.py               # all rows (cached, see CACHE)
    PYTHONPATH=src python bench/bench_experts.py --workers 2   # two processes search jobs
    PYTHONPATH=src python bench/bench_experts.py --sample 40   # every k-th row, for a quick look
    PYTHONPATH=src python bench/bench_experts.py --runs megatron-bridge   # one set (to bench/results/)

For every large gain a verdict (bench/experts_evidence.py): whether another measured layout of the
same job shows it (same release, another release, or a row whose layout is not given), whether it
comes from a technique the published run did not have, whether it disappears against the
published run's measured step (the model's error on the published plan), or whether it rests on
the model alone. Per row also the band the recommendation holds the two plans to (bench/experts_band.py:
the model's measured error on the ratio of two layouts, calib/pairwise.py), and whether the
published plan is estimated faster than the recommendation by more than it.

Rows of one job (same model, cluster, training and calibration: 417 rows are 159 jobs) share one
search, the largest searches first. Results are cached in bench/results/experts_cache.json under a
hash of the planner's source (cost/, search/, spec/, calib/, targets.py, plan/, data/), written after
every job, so an unchanged model re-renders in seconds (``--render-only``), an interrupted run
resumes, and any change to the model re-runs every search (all 159 jobs: 573-622 CPU s of searching,
28-29 min wall with --workers 2 on the shared 2-core machine at a load of ~9, 2026-11-24).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from meshplan.data.published import PUBLISHED_RUNS

# bench/ is the script's directory, on sys.path; the work is split by responsibility:
# searching (experts_compare), caching the searches (experts_cache), the page (experts_render)
from experts_cache import CACHE, ROOT, render_cached, run_all
from experts_render import _quantiles, render

DOC = ROOT / "docs" / "experts.md"
log = logging.getLogger("bench_experts")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=None, help="About this many rows per CSV (every k-th).")
    ap.add_argument("--out", type=Path, default=DOC)
    ap.add_argument("--workers", type=int, default=1, help="Processes searching jobs in parallel.")
    ap.add_argument("--render-only", action="store_true",
                    help="Re-render the cached rows whatever source they were computed on (no search).")
    ap.add_argument("--runs", action="append", choices=tuple(PUBLISHED_RUNS), default=None,
                    help="Only this set of runs (repeatable; default all). With a subset the page goes to "
                         "bench/results/experts_<sets>.md unless --out says otherwise.")
    ap.add_argument("--rows", default=None,
                    help="Only these row ids, comma separated (with --runs: a few rows re-searched after a "
                         "change; the page then goes to bench/results/experts_rows.md unless --out says otherwise).")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sets = tuple(dict.fromkeys(args.runs or PUBLISHED_RUNS))
    out = args.out
    if out == DOC and set(sets) != set(PUBLISHED_RUNS):
        out = CACHE.parent / f"experts_{'_'.join(sets)}.md"  # docs/experts.md is the page of every set
    only = frozenset(x.strip() for x in args.rows.split(",")) if args.rows else frozenset()
    if only and args.out == DOC:
        out = CACHE.parent / "experts_rows.md"
    rows, skipped, stats = (render_cached(sets) if args.render_only
                            else run_all(args.sample, args.workers, sets, only))
    out.write_text(render(rows, skipped, stats, args.sample, sets))
    ratios = [r.ratio for r in rows if r.ratio is not None]
    log.info(f"{len(rows)} rows, ratio {_quantiles(ratios)}; wrote {out} in {stats['wall_s']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
