"""What two measured runs that hold the same states say about a missing memory term (a bench;
issue 14, memory: "never more than 5% optimistic for a run that fit").

    PYTHONPATH=src python bench/memory_pairs.py                       # the held-out CSV
    PYTHONPATH=src python bench/memory_pairs.py --runs calibration --json

A term the estimate lacks shows up in a single row as a shortfall, but any number of candidate
terms can fill one shortfall. Two rows whose sharded states are the same (same model, GPU, stack,
precision, tensor and pipeline degrees and FSDP shard group dp x cp) differ only in what the plan
holds beyond them: activations, the logits, the schedule's in-flight micro-batches, context
parallel's buffers. For every such pair this prints what differs between the two plans, the
tokens each micro-batch puts on a rank (b x S / cp), the estimate's difference and the measured
one, and the residual (measured difference - estimated difference). A missing mechanism has to
account for the residual of every pair at once: a term that depends on the tokens per
micro-batch only cannot separate two rows with the same tokens per micro-batch, and a term that
raises one schedule's peak has to lower nothing. Rows are paired in both orders only once (a
before b in the CSV). Nothing here fits anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import Run, load_runs, memory_on_basis, setting_calibration
from meshplan.cost.step import estimate
from meshplan.data.published import runs_csv

HERE = Path(__file__).parent
DEFAULT_RUNS = HERE / "data" / "runs_heldout.csv"
SHIPPED = ("calibration", "megatron-bridge")


def states_key(run: Run) -> tuple:
    """What fixes a rank's sharded states (parameters, gradients, optimizer): two rows with the
    same key hold the same states on their most loaded rank whatever their batch or schedule."""
    d = run.plan.dims
    return (run.model.name, run.cluster.gpu.name, run.stack, run.training.precision.value,
            run.memory_basis.value, d.tp, d.pp, d.dp_shard * d.cp, run.plan.zero)


def plan_fields(run: Run) -> dict[str, Any]:
    """The settings of a row that can change its memory beyond its states."""
    p, d = run.plan, run.plan.dims
    return {"seq_len": run.training.seq_len, "micro_batch": p.micro_batch, "schedule": p.schedule.value,
            "vpp": p.vpp, "cp": d.cp, "dp_shard": d.dp_shard,
            "micro_batches": run.training.global_batch // (p.micro_batch * d.dp_shard * d.dp_replicate),
            "recompute": p.recompute.value, "stage_layers": ",".join(map(str, p.stage_layers))}


def tokens_per_microbatch(run: Run) -> int:
    """Tokens one micro-batch puts on a rank: b x S / cp."""
    return run.plan.micro_batch * run.training.seq_len // run.plan.dims.cp


def predicted_gib(run: Run) -> float:
    """The estimate on the row's own memory basis (as ``meshplan validate`` compares it)."""
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    return memory_on_basis(est, run.memory_basis)


def contrast(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One pair: ``a`` and ``b`` carry id, fields, tokens, measured_gib and predicted_gib."""
    differs = {k: (a["fields"][k], b["fields"][k]) for k in a["fields"] if a["fields"][k] != b["fields"][k]}
    model_delta = b["predicted_gib"] - a["predicted_gib"]
    measured_delta = b["measured_gib"] - a["measured_gib"]
    return {"a": a["id"], "b": b["id"], "differs": differs,
            "tokens_per_microbatch": (a["tokens"], b["tokens"]),
            "same_tokens_per_microbatch": a["tokens"] == b["tokens"],
            "error": (a["predicted_gib"] / a["measured_gib"] - 1.0, b["predicted_gib"] / b["measured_gib"] - 1.0),
            "model_delta_gib": model_delta, "measured_delta_gib": measured_delta,
            "residual_gib": measured_delta - model_delta}


def pairs(runs: list[Run]) -> list[dict[str, Any]]:
    """Every pair of rows with a measured memory and the same states key, largest residual first."""
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        if run.measured_memory_gib is None or run.oom:
            continue
        rows.setdefault(states_key(run), []).append(
            {"id": run.row_id, "fields": plan_fields(run), "tokens": tokens_per_microbatch(run),
             "measured_gib": run.measured_memory_gib, "predicted_gib": predicted_gib(run)})
    out = [contrast(a, b) for group in rows.values() for a, b in combinations(group, 2)]
    return sorted(out, key=lambda c: -abs(c["residual_gib"]))


def _table(found: list[dict[str, Any]], min_residual_gib: float) -> Table:
    table = Table(title=f"Rows holding the same states (|residual| >= {min_residual_gib:g} GiB): "
                        "measured vs estimated difference b - a (GiB)")
    for c in ("a", "b", "what differs (a -> b)", "tokens/mb", "err a", "err b", "model", "measured", "residual"):
        table.add_column(c, justify="left" if c in ("a", "b", "what differs (a -> b)") else "right")
    for c in found:
        if abs(c["residual_gib"]) < min_residual_gib:
            continue
        what = "; ".join(f"{k} {x}->{y}" for k, (x, y) in c["differs"].items()) or "nothing in the plan"
        ta, tb = c["tokens_per_microbatch"]
        table.add_row(c["a"], c["b"], what, f"{ta}" if ta == tb else f"{ta}->{tb}",
                      f"{c['error'][0]:+.1%}", f"{c['error'][1]:+.1%}", f"{c['model_delta_gib']:+.1f}",
                      f"{c['measured_delta_gib']:+.1f}", f"{c['residual_gib']:+.1f}")
    return table


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DEFAULT_RUNS), help="a runs CSV or a shipped set (calibration)")
    ap.add_argument("--min-residual", type=float, default=0.0, help="print pairs with |residual| >= this (GiB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    path = runs_csv(args.runs) if args.runs in SHIPPED else args.runs
    runs, _ = load_runs(path)
    found = pairs(runs)
    if args.json:
        Console().print_json(json.dumps({"pairs": found}))
        return 0
    Console(width=200).print(_table(found, args.min_residual))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
