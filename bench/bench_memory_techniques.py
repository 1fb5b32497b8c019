"""Where the memory techniques win: the frontier of published jobs with and without each one.

    PYTHONPATH=src python bench/bench_memory_techniques.py          # table
    PYTHONPATH=src python bench/bench_memory_techniques.py --json   # the same as JSON
    PYTHONPATH=src python bench/bench_memory_techniques.py 8b-8xh100-32k   # some jobs only

For each job the search runs twice, with the technique searched and without it; the table gives
both recommended plans (fastest within the default budget), the least GPU memory either frontier
reaches, and the frontier points only the technique makes possible (points of the frontier with
it that the frontier without it does not dominate). "Without" searches with every technique of
this bench off; "with" turns that one on. Techniques: offload (meshplan.cost.offload, every
stack's space), OSDP's per-operator-group sharding and operator splitting (meshplan.cost.osdp),
vocabulary parallelism over pipeline ranks (meshplan.cost.vocab) in the space meshplan's runtime
runs (``--target meshplan``: the only stack that has it; GPipe or 1F1B, tp 1), and the same over
every schedule and tp degree ("vocab-parallel (model)": what the paper's own schedules would add;
no stack runs those plans). For the vocabulary, a second table gives the per-stage memory and
micro-batch time of the fastest fitting plan only it makes possible, with and without it: the
balance it buys.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

import numpy as np

from meshplan.cost import estimate
from meshplan.search.frontier import dominated_by
from meshplan.search.planner import SearchResult, search
from meshplan.search.space import OFFLOAD_CHOICES, SearchOptions
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target, planner_only_feature, search_options


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    system: str
    nodes: int
    seq_len: int
    global_batch: int
    why: str
    override: tuple[tuple[str, str], ...] = ()
    """Model fields changed from the preset (e.g. a 256K vocabulary on a Llama-3-8B body)."""


CASES = (
    Case("70b-8xh100", "llama3-70b", "dgx-h100", 1, 8192, 32,
         "Llama-3-70B on one DGX H100: 16 bytes of states per parameter need 140 GB per GPU"),
    Case("70b-16xh100", "llama3-70b", "dgx-h100", 2, 8192, 64, "the same on two nodes"),
    Case("405b-64xh100", "llama3.1-405b", "dgx-h100", 8, 8192, 64,
         "Llama-3.1-405B on 8 nodes (Meta trained it on 16K GPUs)"),
    Case("405b-128xh100", "llama3.1-405b", "dgx-h100", 16, 8192, 128, "on 16 nodes"),
    Case("70b-8xgb200", "llama3-70b", "gb200-nvl72", 2, 8192, 32,
         "Llama-3-70B on 2 GB200 trays: Grace's NVLink-C2C instead of PCIe"),
    Case("70b-64xh100", "llama3-70b", "dgx-h100", 8, 8192, 256, "128K vocabulary, pipelined"),
    Case("qwen72b-64xh100", "qwen2.5-72b", "dgx-h100", 8, 8192, 256, "152K vocabulary, pipelined"),
    Case("gptoss120b-32xh100", "gpt-oss-120b", "dgx-h100", 4, 8192, 256, "201K vocabulary, MoE, 36 layers"),
    Case("8b-8xh100-128k", "llama3-8b", "dgx-h100", 1, 131072, 8,
         "Llama-3-8B at 128K tokens on one node: the 128K-vocabulary logits of a sequence take ~64 GiB"),
    Case("13b-8xa100", "llama2-13b", "dgx-a100", 1, 4096, 64,
         "Llama-2-13B on one DGX A100 (80 GB): ZeRO-3 gathers on the A100's NVLink are exposed"),
    Case("qwen30b-a3b-16xh100", "qwen3-30b-a3b", "dgx-h100", 2, 8192, 128,
         "152K vocabulary on a 2048-wide MoE (V/D = 74), 48 layers"),
    Case("qwen30b-a3b-32xh100", "qwen3-30b-a3b", "dgx-h100", 4, 4096, 256, "the same on 32 GPUs, seq 4K"),
    Case("8b-256k-16xa100", "llama3-8b", "dgx-a100", 2, 4096, 256,
         "a 256K vocabulary (Gemma's size) on Llama-3-8B's body", override=(("vocab_size", "256000"),)),
)

BASE = SearchOptions(offloads=(), vocab_parallel=False, osdp=False)


def techniques(model, training) -> dict[str, tuple[SearchOptions, SearchOptions]]:
    """name -> (search options without, with the technique); without: none of this bench's on."""
    out = {"offload": (BASE, replace(BASE, offloads=OFFLOAD_CHOICES)),
           "osdp": (BASE, replace(BASE, osdp=True))}
    if planner_only_feature(model) is None:  # else meshplan's runtime cannot train the model at all
        runtime = replace(search_options(Target.MESHPLAN, model, training), offloads=(), vocab_parallel=False,
                          osdp=False)
        out["vocab-parallel"] = (runtime, replace(runtime, vocab_parallel=True))
    out["vocab-parallel (model)"] = (BASE, replace(BASE, vocab_parallel=True))
    return out


def _point(pt) -> dict:
    return {"plan": pt.plan.notation(), "step_time_s": pt.step_time_s, "peak_memory_gib": pt.peak_memory_gib,
            "mfu": pt.mfu}


def only_with(with_: SearchResult, without: SearchResult) -> list:
    """Points of ``with_``'s frontier that no point of ``without``'s frontier dominates."""
    t = np.array([p.step_time_s for p in without.frontier])
    m = np.array([p.peak_memory_bytes for p in without.frontier])
    q_t = np.array([p.step_time_s for p in with_.frontier])
    q_m = np.array([p.peak_memory_bytes for p in with_.frontier])
    covered = dominated_by(t, m, q_t, q_m) if t.size else np.zeros(q_t.shape, dtype=bool)
    return [p for p, c in zip(with_.frontier, covered) if not c]


def stage_balance(model, cluster, training, plan) -> dict:
    """Per pipeline rank, peak memory (GiB) and micro-batch time (ms) of ``plan`` with and
    without vocabulary parallelism (the same degrees, schedule and even layer split)."""
    out = {}
    for label, vp in (("without", False), ("with", True)):
        est = estimate(model, cluster, training, replace(plan, vocab_parallel=vp))
        out[label] = {"step_time_s": est.step_time_s,
                      "peak_gib": [(s.memory.allocated_bytes + s.memory.reserve_bytes) / GIB for s in est.stages],
                      "microbatch_ms": [1e3 * s.microbatch_time_s for s in est.stages]}
    return out


def run_case(case: Case) -> dict:
    model = model_preset(case.model)
    if case.override:
        model = model.with_overrides(dict(case.override))
    cluster = system_preset(case.system, num_nodes=case.nodes)
    training = TrainingSpec(seq_len=case.seq_len, global_batch=case.global_batch)
    out = {"case": case.name, "why": case.why, "gpus": cluster.num_gpus, "techniques": {}}
    searched: dict[SearchOptions, SearchResult] = {}

    def run(options: SearchOptions) -> SearchResult:
        if options not in searched:
            searched[options] = search(model, cluster, training, options=options)
        return searched[options]

    for name, (off, on) in techniques(model, training).items():
        without, with_ = run(off), run(on)
        new = only_with(with_, without)
        fitting_new = [p for p in new if p.peak_memory_bytes <= with_.budget_bytes]
        out["techniques"][name] = {
            "without": _point(without.recommended) if without.recommended else None,
            "with": _point(with_.recommended) if with_.recommended else None,
            "min_memory_gib_without": without.min_memory_bytes / GIB,
            "min_memory_gib_with": with_.min_memory_bytes / GIB,
            "frontier_without": len(without.frontier), "frontier_with": len(with_.frontier),
            "only_with": len(new), "only_with_fitting": [_point(p) for p in fitting_new[:3]],
        }
        if name == "vocab-parallel" and fitting_new:
            fastest = min(fitting_new, key=lambda p: p.step_time_s)
            out["stage_balance"] = {"plan": fastest.plan.notation(),
                                    **stage_balance(model, cluster, training, fastest.plan)}
    return out


def _fmt(pt) -> str:
    if pt is None:
        return "nothing fits"
    return f"{pt['plan']}  {pt['step_time_s']:.1f} s, {pt['peak_memory_gib']:.0f} GiB, MFU {100 * pt['mfu']:.0f}%"


def main(argv: list[str]) -> None:
    names = [a for a in argv if not a.startswith("--")]
    results = [run_case(c) for c in CASES if not names or c.name in names]
    if "--json" in argv:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Memory techniques: recommended plan without / with, and frontier points only it makes")
    for col in ("job", "technique", "without", "with", "least GiB w/o -> with", "front w/o, with, only-with"):
        table.add_column(col)
    for r in results:
        for name, t in r["techniques"].items():
            table.add_row(f"{r['case']} ({r['gpus']} GPUs)", name, _fmt(t["without"]), _fmt(t["with"]),
                          f"{t['min_memory_gib_without']:.0f} -> {t['min_memory_gib_with']:.0f}",
                          f"{t['frontier_without']}, {t['frontier_with']}, {t['only_with']}")
    Console(width=220).print(table)
    balance = Table(title="Vocabulary parallelism (meshplan runtime): per-stage peak GiB and micro-batch ms "
                          "of the fastest fitting plan only it makes, without -> with")
    for col in ("job", "plan", "peak GiB per stage", "micro-batch ms per stage", "step s"):
        balance.add_column(col)
    for r in results:
        b = r.get("stage_balance")
        if b is None:
            continue
        w, v = b["without"], b["with"]
        balance.add_row(r["case"], b["plan"],
                        " ".join(f"{x:.0f}" for x in w["peak_gib"]) + " -> " + " ".join(f"{x:.0f}" for x in v["peak_gib"]),
                        " ".join(f"{x:.0f}" for x in w["microbatch_ms"]) + " -> "
                        + " ".join(f"{x:.0f}" for x in v["microbatch_ms"]),
                        f"{w['step_time_s']:.2f} -> {v['step_time_s']:.2f}")
    Console(width=220).print(balance)


if __name__ == "__main__":
    main(sys.argv[1:])
