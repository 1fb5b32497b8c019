"""Markdown tables of saved dry runs against the cost model, for docs/dryrun.md (no torch).

``PYTHONPATH=src python bench/dryrun_report.py [--targets bench/results/dryrun_targets.json]
[--memory bench/results/dryrun_memory_<date>.json] [--origins N] [--calibration FIELD=VALUE ...]``

The cost model's side is computed again from the job (``report.dryrun.compare`` on the saved dry-run
results), so the tables follow the cost model of the checkout. Per rank: the tracked peak against
the model's tensors (``model_tensor_bytes``: its peak less the CUDA context, NCCL and fragmentation,
which no tensor tracker sees), and the peak split into four parts, each side by its own terms:

- **states**: the tracker's Parameter, Gradient, Optstate and Buffer tensors (fp32 masters, gathered
  16-bit weights, FSDP's gradient buffers), the fp32 casts of gradients before their reduction
  (``is_gradient_cast``) and FSDP's backward buffers (``is_fsdp_buffer``); the model's weights,
  gradients, optimizer states and ZeRO-3 gathered layers and buffers;
- **layers**: Activation and Temp tensors allocated inside a transformer block
  (``*.layers.*``); the model's activations less the logits;
- **head + loss**: Activation and Temp tensors of the final norm, the LM head and the loss (and
  everything outside a module); the model's logits and loss transients;
- **rest**: what is left (the embedding, the pipeline's receive buffers: empty tensors allocated
  outside any module; the model's communication buckets).

With ``--origins N``: the N largest origins (category, module, op, dtype) of every rank off by more
than 10%.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshplan.report.dryrun import GIB, compare

OFF_THRESHOLD = 0.10
"""A rank is 'off' when its tracked peak differs from the model's tensors by more than this."""
STATE_CATEGORIES = ("Parameter", "Gradient", "Optstate", "Buffer")
HEAD_MODULES = (".output", ".norm", "-")
BUFFER_OPS = ("aten.empty_strided.default", "aten.empty.memory_format")
"""Ops of buffers allocated empty outside any module: the pipeline schedule's receive buffers."""
"""Module suffixes of the LM head, the final norm, and tensors allocated outside any module (the loss)."""


def is_gradient_cast(origin: dict) -> bool:
    """An fp32 copy made in backward by an FSDP unit (the root, a block, or outside any module, where
    FSDP2's post-backward runs): the 16-bit gradient cast to the reduce dtype (MixedPrecisionPolicy's
    reduce_dtype=fp32) before its reduce-scatter or all-reduce. MemTracker files it as Temp."""
    module = origin["module"]
    unit = module == "-" or "." not in module or module.endswith(".layers.*")
    return (origin["category"] == "Temp" and origin["op"] == "aten._to_copy.default"
            and origin["dtype"] == "float32" and unit)


def is_fsdp_buffer(origin: dict) -> bool:
    """An empty buffer a block's FSDP unit allocates in backward: the reduce-scatter input in the
    reduce dtype (fp32) and the prefetched layer's all-gather output (16-bit), torch 2.13
    _fsdp_collectives.py foreach_reduce / foreach_all_gather. MemTracker files them as Temp under
    the block; the model holds them with the gathered weights (meshplan/fsdp_policy.py)."""
    return (origin["category"] == "Temp" and origin["op"] == "aten.empty.memory_format"
            and origin["module"].endswith(".layers.*"))


def part_of(origin: dict) -> str:
    """states / layers / head + loss / rest, for one origin of the tracker's peak."""
    module = origin["module"]
    if origin["category"] in STATE_CATEGORIES or is_gradient_cast(origin) or is_fsdp_buffer(origin):
        return "states"
    if ".layers." in module + ".":
        return "layers"
    if module == "-" and origin["op"] in BUFFER_OPS:
        return "rest"  # the pipeline stage's receive buffers (allocated by the schedule, no module)
    if module == "-" or module.endswith(HEAD_MODULES):
        return "head + loss"
    return "rest"


def dry_parts(dry: dict) -> dict[str, float]:
    parts = dict.fromkeys(("states", "layers", "head + loss", "rest"), 0.0)
    for o in dry.get("peak_origins", []):
        parts[part_of(o)] += o["bytes"]
    return parts


def model_parts(m: dict) -> dict[str, float]:
    if "logits_bytes" not in m:  # saved before the split existed
        return dict.fromkeys(("states", "layers", "head + loss", "rest"), float("nan"))
    states = (m["parameters_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"]
              + m["gathered_weight_bytes"])
    layers = m["activations_bytes"] - m["logits_bytes"]
    return {"states": states, "layers": layers, "head + loss": m["logits_bytes"],
            "rest": m["tensor_bytes"] - states - layers - m["logits_bytes"]}


def comparisons(saved: dict, jobs: dict, overrides: dict | None = None) -> list[tuple[str, object]]:
    """compare() on every saved plan; ``overrides``: Calibration fields replaced for the cost model."""
    from dataclasses import replace

    from meshplan.cost import calibration_for

    out = []
    for name, entry in saved.items():
        if name in jobs:
            job = jobs[name]
            calib = replace(calibration_for(job.cluster.gpu), **(overrides or {}))
            out += [(name, c) for c in compare(job, [r["dry_run"] for r in entry["ranks"]], calib)]
    return out


def saved_comparisons(saved: dict) -> list[tuple[str, object]]:
    """The comparisons as saved by the run (the cost model of the checkout that ran them)."""
    from meshplan.report.dryrun import RankComparison

    return [(name, RankComparison(rank=r["rank"], pp_rank=r["pp_rank"], measured=r["dry_run"],
                                  model_memory=r["cost_model_memory"], collectives=r["collectives"]))
            for name, entry in saved.items() for r in entry["ranks"]]


def parse_override(text: str) -> tuple[str, object]:
    """'field=value' of a Calibration field: true/false, or a number."""
    field, _, value = text.partition("=")
    if value.lower() in ("true", "false"):
        return field, value.lower() == "true"
    return field, float(value)


def render(rows: list[tuple[str, object]], origins: int) -> str:
    g = lambda b: "-" if b != b else f"{b / GIB:.2f}"  # NaN: no model split saved with the run
    lines = ["| job | rank (pp) | wall s | peak GiB | model GiB | model tensors GiB | diff (tensors) "
             "| states dry / model | layers dry / model | head + loss dry / model | rest dry / model | peak at |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    off = []
    for name, c in rows:
        d, m = c.measured, c.model_memory
        dp, mp = dry_parts(d), model_parts(m)
        split = " | ".join(f"{g(dp[k])} / {g(mp[k])}" for k in dp)
        lines.append(f"| {name} | {c.rank} ({c.pp_rank}) | {d['wall_s']:.0f} | {g(d['peak_bytes'])} | "
                     f"{g(m['total_bytes'])} | {g(m['tensor_bytes'])} | {c.tensor_difference:+.0%} | {split} | "
                     f"{d.get('peak_at', '')} |")
        if abs(c.tensor_difference) > OFF_THRESHOLD:
            off.append((name, c))
    diffs = sorted(abs(c.tensor_difference) for _, c in rows)
    if diffs:
        mid = len(diffs) // 2
        median = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
        lines += ["", f"{len(diffs)} ranks: median |diff (tensors)| {median:.1%}, "
                      f"{len(off)} over {OFF_THRESHOLD:.0%}."]
    if origins and off:
        for name, c in off:
            lines += ["", f"{name}, rank {c.rank}: largest origins at the peak (GiB)", "",
                      "| GiB | category | module | op | dtype |", "|---|---|---|---|---|"]
            lines += [f"| {g(o['bytes'])} | {o['category']} | {o['module']} | {o['op']} | {o['dtype']} |"
                      for o in c.measured.get("peak_origins", [])[:origins]]
    return "\n".join(lines)


def render_collectives(rows: list[tuple[str, object]]) -> str:
    """Rank 0's collectives per step of every job: count and GiB, dry run against the cost model."""
    lines = ["| job | group | kind | count | model count | GiB | model GiB |", "|---|---|---|---|---|---|---|"]
    for name, c in rows:
        if c.rank == 0:
            lines += [f"| {name} | {r['group']} | {r['kind']} | {r['count']} | {r['model_count']:.0f} | "
                      f"{r['bytes'] / GIB:.2f} | {r['model_bytes'] / GIB:.2f} |" for r in c.collectives]
    return "\n".join(lines)


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_dryrun_memory import bench_jobs
    from dryrun_targets import target_jobs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=Path)
    ap.add_argument("--memory", type=Path)
    ap.add_argument("--origins", type=int, default=0)
    ap.add_argument("--collectives", action="store_true", help="rank 0's collectives table instead")
    ap.add_argument("--as-saved", action="store_true",
                    help="the cost model's side as saved with the runs (no split), not this checkout's")
    ap.add_argument("--calibration", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="Calibration fields replaced for the cost model's side (e.g. a stack value under review)")
    args = ap.parse_args()
    overrides = dict(parse_override(t) for t in args.calibration)
    rows = []
    if args.targets:
        rows += comparisons(json.loads(args.targets.read_text()), target_jobs(), overrides)
    if args.memory:
        saved = json.loads(args.memory.read_text())
        rows += saved_comparisons(saved) if args.as_saved else comparisons(saved, bench_jobs(), overrides)
    print(render_collectives(rows) if args.collectives else render(rows, args.origins))


if __name__ == "__main__":
    main()
