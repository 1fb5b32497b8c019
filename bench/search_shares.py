"""Where one search's CPU time goes: ``time.process_time`` around each step of
``meshplan.search.planner.search`` (and the refinement's and the cell pruning's parts), for one of
``bench_search.py``'s cases, after a warm-up run.

    PYTHONPATH=src python bench/search_shares.py dsv3-1024-megatron [--repeats 2]

Nested steps are counted inside their parents (``_refine`` holds ``refine.stage_frontier``, the
stage walk; ``prune_groups`` holds ``group_bounds`` and ``surviving``). cProfile inflates numpy-heavy
code unevenly; these wrapped timers do not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import search_frontiers as SF  # noqa: E402

PLANNER_STEPS = ("prune_groups", "cross_groups", "shared_layer_cost", "_even_estimate", "_refine",
                 "embedding_loss_front", "_vocab_pass", "_osdp_pass", "_offload_pass", "_placement_pass",
                 "enumerate_groups", "configurations_per_group")
REFINE_STEPS = ("stage_probes", "stage_table", "relaxed_bounds", "stage_frontier", "score_splits")
GROUP_STEPS = ("group_bounds", "surviving")


def _wrap(module, name: str, label: str, spent: dict[str, float]) -> None:
    inner = getattr(module, name)

    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - start

    setattr(module, name, timed)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    import meshplan.search.group_prune as group_prune
    import meshplan.search.planner as planner
    import meshplan.search.refine as refine

    spent: dict[str, float] = defaultdict(float)
    for name in PLANNER_STEPS:
        _wrap(planner, name, name, spent)
    for name in REFINE_STEPS:
        _wrap(refine, name, f"refine.{name}", spent)
    for name in GROUP_STEPS:
        _wrap(group_prune, name, f"prune_groups.{name}", spent)
    run, _ = SF._job(args.case)
    run()  # warm-up
    for _ in range(args.repeats):
        spent.clear()
        start = time.process_time()
        run()
        print(f"{args.case}: {time.process_time() - start:.3f} CPU s")
        for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"  {label:32s} {seconds:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
