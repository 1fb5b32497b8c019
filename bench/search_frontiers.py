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


def _job(name: str):
    from meshplan.search.planner import search
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    if name in B.MOE_CASES:
        from meshplan.calib.hardware import resolve_hardware
        from meshplan.cli.common import load_cluster
        from meshplan.targets import search_options

        model, gpu, gpus, seq, batch, stack, _ = B.MOE_CASES[name]
        spec, training = model_preset(model), TrainingSpec(seq_len=seq, global_batch=batch)
        hw = resolve_hardware(load_cluster(None, gpu, None, None, gpus=gpus), training.precision, None, stack)
        options = search_options(stack, spec, training)
        return (lambda: search(spec, hw.cluster, training, calib=hw.calib, options=options)), B.MOE_REPEATS
    model, system, nodes, seq, batch, _ = B.CASES[name]
    spec, cluster = model_preset(model), system_preset(system, num_nodes=nodes)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    return (lambda: search(spec, cluster, training)), B.REPEATS


def measure(names: list[str], out: Path) -> None:
    from meshplan.search.planner import search
    from meshplan.spec.cluster import system_preset
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    search(model_preset("toy-llama"), system_preset("dgx-h100"), TrainingSpec(seq_len=128, global_batch=8))  # warm-up
    saved = {}
    for name in names:
        run, repeats = _job(name)
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
    left, right = pickle.loads(a.read_bytes()), pickle.loads(b.read_bytes())
    bad = 0
    for name in right:
        if name in left:
            same = left[name] == right[name]
            bad += not same
            print(f"{name:22s} {'identical' if same else 'DIFFERENT'}  {len(left[name])} / {len(right[name])} points")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=[*B.CASES, *B.MOE_CASES])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2)
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        print("give --out FILE (or --compare A B)", file=sys.stderr)
        return 2
    measure(args.cases, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
