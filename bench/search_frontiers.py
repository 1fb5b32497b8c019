"""CPU time and frontier of ``bench_search.py``'s cases, saved so that two versions of the search
can be compared point by point (times, memories and plans): what a speed change must leave equal.

    PYTHONPATH=src python bench/search_frontiers.py --out new.pkl 7b qwen30b-megatron
    PYTHONPATH=/path/to/main/src python bench/search_frontiers.py --out main.pkl 7b qwen30b-megatron
    python bench/search_frontiers.py --compare main.pkl new.pkl

Run the two versions alternately, case by case, on a shared machine (the CPU time moves with the
load); the dense cases report the fastest of three runs, the MoE cases one run
(``bench_search.REPEATS`` / ``MOE_REPEATS``).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_search as B  # noqa: E402


def _job(name: str, stage_points: int | None = -1):
    from meshplan.search.planner import search
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    kw = {} if stage_points == -1 else {"stage_points": stage_points}  # -1: the search's default
    if name in B.MOE_CASES:
        from meshplan.calib.hardware import resolve_hardware
        from meshplan.cli.common import load_cluster
        from meshplan.targets import search_options

        model, gpu, gpus, seq, batch, stack, _ = B.MOE_CASES[name]
        spec, training = model_preset(model), TrainingSpec(seq_len=seq, global_batch=batch)
        hw = resolve_hardware(load_cluster(None, gpu, None, None, gpus=gpus), training.precision, None, stack)
        options = search_options(stack, spec, training)
        return (lambda: search(spec, hw.cluster, training, calib=hw.calib, options=options, **kw)), B.MOE_REPEATS
    model, system, nodes, seq, batch, _ = B.CASES[name]
    spec, cluster = model_preset(model), system_preset(system, num_nodes=nodes)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    return (lambda: search(spec, cluster, training, **kw)), B.REPEATS


def measure(names: list[str], out: Path, stage_points: int | None = -1) -> None:
    from meshplan.search.planner import search
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    search(model_preset("toy-llama"), system_preset("dgx-h100"), TrainingSpec(seq_len=128, global_batch=8))  # warm-up
    saved = {}
    for name in names:
        run, repeats = _job(name, stage_points)
        cpu = float("inf")
        for _ in range(repeats):
            cpu0 = time.process_time()
            res = run()
            cpu = min(cpu, time.process_time() - cpu0)
        saved[name] = [(p.step_time_s, p.peak_memory_bytes, p.plan) for p in res.frontier]
        rec = res.recommended
        print(f"{name:22s} cpu s {cpu:8.3f}  refined {res.refined_configs:8,d}  frontier {len(res.frontier):4d}  "
              f"{rec.plan.notation() if rec else 'nothing fits'}", flush=True)
    out.write_bytes(pickle.dumps(saved))


def compare(a: Path, b: Path) -> int:
    """Frontiers of A and B case by case: identical, or the points B drops and adds, and whether
    every dropped point is dominated (no slower, no larger: a leaner or faster plan replaced it)
    by one of B's. Exit 1 when a dropped point is not (B lost a point), 0 otherwise."""
    left, right = pickle.loads(a.read_bytes()), pickle.loads(b.read_bytes())
    bad = 0
    for name in right:
        if name not in left:
            continue
        if left[name] == right[name]:
            print(f"{name:22s} identical  {len(left[name])} / {len(right[name])} points")
            continue
        old, new = ({(t, m) for t, m, _ in left[name]}, {(t, m) for t, m, _ in right[name]})
        dropped, added = sorted(old - new), sorted(new - old)
        rel = 1 + 1e-9
        lost = [(t, m) for t, m in dropped
                if not any(t2 <= t * rel and m2 <= m * rel for t2, m2 in new)]
        beaten = sum(any(t2 <= t * rel and m2 <= m * rel for t2, m2 in added) for t, m in dropped)
        bad += bool(lost)
        span = (f" (added {min(m for _, m in added) / 1e9:.1f}-{max(m for _, m in added) / 1e9:.1f} GB)"
                if added else "")
        print(f"{name:22s} DIFFERENT  {len(left[name])} -> {len(right[name])} points: dropped {len(dropped)} "
              f"({beaten} dominated by an added point, {len(lost)} not dominated), added {len(added)}{span}"
              + ("" if dropped or added else " (same points, other plans)"))
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=[*B.CASES, *B.MOE_CASES])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2)
    ap.add_argument("--stage-points", default="default",
                    help="the stage walk's cap per configuration: a number, 'none', or 'default' (the search's)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        print("give --out FILE (or --compare A B)", file=sys.stderr)
        return 2
    sp = {"default": -1, "none": None}.get(args.stage_points.lower(), None)
    if args.stage_points.lower() not in ("default", "none"):
        if not args.stage_points.isdigit():
            print(f"--stage-points: {args.stage_points!r} is not a number, 'none' or 'default'", file=sys.stderr)
            return 2
        sp = int(args.stage_points)
    measure(args.cases, args.out, sp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
