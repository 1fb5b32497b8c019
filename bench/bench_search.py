"""Search speed: wall time, CPU time and plans evaluated per second for the issue's three cases
and MoE cases under an export target (what ``meshplan plan --gpu G --gpus N --target T`` searches:
the target's space and calibration).

    PYTHONPATH=src python bench/bench_search.py            # all cases
    PYTHONPATH=src python bench/bench_search.py 70b        # one case

Run it pinned to one core (``taskset -c 0``) for the figures in the README; on a loaded machine
compare the CPU time column, which other processes do not inflate.

Before / after: each case also runs ``search(..., prune=False)`` (every configuration scored in
full, every stage grid walked whole: ``meshplan.search.prune``, ``stages._top``) and prints its CPU
time and whether its frontier (times, memories, plans) is the pruned search's (the MoE cases
skip it: their unpruned spaces of 10-20M configurations take minutes; their exactness is
tests/golden/search/qwen3_30b_a3b_gb200x32_megatron.json's and that of
tests/planner/test_search_prune.py's random MoE models; a change to the search compares their
frontiers with main's point by point, as docs/search.md's Speed section records).
"""

from __future__ import annotations

import sys
import time

from meshplan.search.planner import search
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

CASES = {
    # name: (model, system, nodes, seq_len, global batch, target seconds)
    "7b": ("llama2-7b", "dgx-h100", 1, 2048, 64, 0.1),
    "70b": ("llama3-70b", "dgx-h100", 128, 8192, 1024, 1.0),
    "405b": ("llama3.1-405b", "dgx-h100", 2048, 8192, 2048, 2.0),
    # the largest space of the published runs (Narayanan et al. 2021's GPT-3 on 3072 A100s):
    # 2.2M global configurations
    "175b": ("gpt3-175b", "dgx-a100", 384, 2048, 1536, 2.0),
}

MOE_CASES = {
    # name: (model, GPU, GPUs, seq_len, global batch, target, target seconds): the standing target
    # for any job is 2 s
    "dsv3-megatron": ("deepseek-v3", "gb200", 256, 4096, 2048, "megatron", 2.0),
    "qwen30b-megatron": ("qwen3-30b-a3b", "gb200", 256, 4096, 2048, "megatron", 2.0),
    "dsv3-1024-megatron": ("deepseek-v3", "gb200", 1024, 4096, 8192, "megatron", 2.0),
    "qwen30b-meshplan": ("qwen3-30b-a3b", "gb200", 256, 4096, 2048, "meshplan", 2.0),
}


REPEATS = 3
"""Each case runs this many times; the fastest run is reported (the usual timing practice: the
others measure interference from other processes)."""

MOE_REPEATS = 1
"""The MoE cases run once: their spaces hold 10-20M configurations (most dropped as groups before
they are crossed, meshplan.search.group_prune); each still takes seconds of CPU."""


def _timed(spec, cluster, training, prune: bool | None):
    wall, cpu = float("inf"), float("inf")
    for _ in range(REPEATS):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        res = search(spec, cluster, training, prune=prune)
        wall = min(wall, time.perf_counter() - wall0)
        cpu = min(cpu, time.process_time() - cpu0)
    return res, wall, cpu


def _points(res):
    return [(p.step_time_s, p.peak_memory_bytes, p.plan) for p in res.frontier]


def run_moe(name: str) -> dict:
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cli.common import load_cluster
    from meshplan.targets import search_options

    model, gpu, gpus, seq, batch, stack, target = MOE_CASES[name]
    spec = model_preset(model)
    training = TrainingSpec(seq_len=seq, global_batch=batch)  # bf16: plan's default on these GPUs
    hw = resolve_hardware(load_cluster(None, gpu, None, None, gpus=gpus), training.precision, None, stack)
    options = search_options(stack, spec, training)
    wall, cpu = float("inf"), float("inf")
    for _ in range(MOE_REPEATS):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        res = search(spec, hw.cluster, training, calib=hw.calib, options=options)
        wall = min(wall, time.perf_counter() - wall0)
        cpu = min(cpu, time.process_time() - cpu0)
    rec = res.recommended
    return {
        "case": f"{model} on {gpus} {gpu}, --target {stack}", "wall_s": wall, "cpu_s": cpu, "target_s": target,
        "cpu_unpruned_s": float("nan"), "same_frontier": None, "pruned": res.pruned_configs,
        "global_configs": res.global_configs, "refined": res.refined_configs,
        "plans_evaluated": res.plans_evaluated, "plans_per_s": res.plans_evaluated / max(cpu, 1e-9),
        "frontier": len(res.frontier), "recommended": rec.plan.notation() if rec else "nothing fits",
        "mfu": rec.mfu if rec else float("nan"),
    }


def run(name: str) -> dict:
    if name in MOE_CASES:
        return run_moe(name)
    model, system, nodes, seq, batch, target = CASES[name]
    spec = model_preset(model)
    cluster = system_preset(system, num_nodes=nodes)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    full, _, cpu_full = _timed(spec, cluster, training, prune=False)
    res, wall, cpu = _timed(spec, cluster, training, prune=None)  # search()'s default
    rec = res.recommended
    return {
        "case": f"{model} on {cluster.num_gpus} GPUs, seq {seq}, batch {batch}",
        "wall_s": wall, "cpu_s": cpu, "target_s": target, "cpu_unpruned_s": cpu_full,
        "same_frontier": _points(full) == _points(res), "pruned": res.pruned_configs,
        "global_configs": res.global_configs, "refined": res.refined_configs,
        "plans_evaluated": res.plans_evaluated, "plans_per_s": res.plans_evaluated / max(cpu, 1e-9),
        "frontier": len(res.frontier),
        "recommended": rec.plan.notation() if rec else "nothing fits",
        "mfu": rec.mfu if rec else float("nan"),
    }


def main(argv: list[str]) -> None:
    names = argv or [*CASES, *MOE_CASES]
    search(model_preset("toy-llama"), system_preset("dgx-h100"), TrainingSpec(seq_len=128, global_batch=8))  # warm-up
    print(f"{'case':55s} {'wall s':>8s} {'cpu s':>8s} {'target':>7s} {'unpruned':>9s} {'same':>5s} "
          f"{'configs':>9s} {'pruned':>9s} {'evaluated':>10s} {'plans/s':>10s} {'front':>6s}  recommended (MFU)")
    for n in names:
        r = run(n)
        print(f"{r['case']:55s} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} {r['target_s']:7.1f} {r['cpu_unpruned_s']:9.3f} "
              f"{'-' if r['same_frontier'] is None else 'yes' if r['same_frontier'] else 'NO':>5s} {r['global_configs']:9,d} {r['pruned']:9,d} "
              f"{r['plans_evaluated']:10,d} {r['plans_per_s']:10,.0f} {r['frontier']:6d}  "
              f"{r['recommended']} ({100 * r['mfu']:.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1:])
