"""Where GPT-OSS's throughput error on Blackwell can sit (a bench, not a test; issue 14, the bf16
bias of the Megatron-Bridge rows).

    PYTHONPATH=src python bench/bench_gptoss_blackwell.py            # GPT-OSS 120B's rows
    PYTHONPATH=src python bench/bench_gptoss_blackwell.py --json
    PYTHONPATH=src python bench/bench_gptoss_blackwell.py --model qwen3-30b-a3b

Three tables, from ``meshplan validate --runs megatron-bridge``'s estimates (nothing is fitted):

1. Per row: the signed error, the time the model lacks, ``missing`` = measured step - predicted
   step (the metric is tokens/s, so measured step = predicted step x (1 + error)), the same per
   layer and micro-batch, and the factor one rate alone would have to take for the row to match:
   the GEMM rate (``matmul_efficiency``), the attention core's (``attention_efficiency``), the
   memory-bound ops' (``hbm_efficiency``). A factor far below 1 rules the term out as the sole
   cause unless the kernel can plausibly run that slowly (e.g. attention x0.3).
2. Per model and row source: each Blackwell row's throughput over the same release's and
   precision's H100 row, measured and predicted, and predicted / measured. A mechanism the model
   misses on Blackwell only shows as a ratio above 1 that other models do not share.
3. The source's own FLOPs per token (model TFLOP/s over tokens/s of each row) against the
   model's count (cost/flops.py model_flops_per_token): a changed formula between releases shows
   as a step, and tells whether the rows' tokens/s and TFLOP/s agree.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from meshplan.calib.validate import Run, load_corrected_runs, predicted_metric, setting_calibration
from meshplan.cost.calibration import Calibration
from meshplan.cost.flops import model_flops_per_token
from meshplan.cost.step import estimate
from meshplan.data.published import runs_csv

BLACKWELL_GPUS = ("b200", "b300", "gb200", "gb300")
REFERENCE_GPU = "h100-sxm"
RATES = ("matmul_efficiency", "attention_efficiency", "hbm_efficiency")
"""The rates whose single-term factor table 1 solves for."""
LOWEST_FACTOR = 0.02
"""The search floor of a factor: a row no rate can close within it reports this."""
BISECTIONS = 30


def _calib(run: Run) -> Calibration:
    return setting_calibration(run, None, {**run.settings, **run.release_values})


def _step_s(run: Run, calib: Calibration) -> float:
    return estimate(run.model, run.cluster, run.training, run.plan, calib).step_time_s


def closing_factor(run: Run, calib: Calibration, rate: str, target_s: float) -> float:
    """The factor on ``rate`` alone that makes the predicted step ``target_s`` (bisection on a log
    scale; 1 when the row is predicted slower than measured: slowing a rate cannot close it)."""
    base = getattr(calib, rate)
    if _step_s(run, calib) >= target_s:
        return 1.0
    lo, hi = LOWEST_FACTOR, 1.0
    for _ in range(BISECTIONS):
        mid = (lo * hi) ** 0.5
        if _step_s(run, calib.replace_fields(**{rate: base * mid})) > target_s:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def row_table(run: Run) -> dict[str, Any]:
    calib = _calib(run)
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    step = est.step_time_s
    pred = predicted_metric(run, step)
    error = None if pred is None or not run.measured else pred / run.measured - 1.0
    measured_step = None if error is None else step * (1.0 + error)
    micro_batches = run.training.global_batch // (run.plan.micro_batch * run.plan.dims.dp)
    layers = run.model.num_layers / run.plan.dims.pp
    missing = None if measured_step is None else measured_step - step
    return {
        "row_id": run.row_id, "source": run.source, "model": run.model.name, "gpu": run.cluster.gpu.name,
        "precision": run.training.precision.value, "plan": run.plan.notation(), "measured": run.measured,
        "predicted": pred, "error": error, "predicted_step_s": step, "measured_step_s": measured_step,
        "missing_s": missing,
        "missing_ms_per_layer_microbatch": None if missing is None else 1e3 * missing / (micro_batches * layers),
        "terms_s": {k: v for k, v in est.time.terms_s().items() if v > 1e-4},
        "closing_factor": ({r: closing_factor(run, calib, r, measured_step) for r in RATES}
                           if measured_step is not None else {}),
    }


def scaling_table(runs: list[Run], preds: dict[str, float]) -> list[dict[str, Any]]:
    """Each Blackwell row over the H100 row of the same model, source and precision (table 2)."""
    groups: dict[tuple[str, str, str], dict[str, Run]] = defaultdict(dict)
    for r in runs:
        if r.measured and r.row_id in preds:
            groups[(r.model.name, r.source, r.training.precision.value)].setdefault(r.cluster.gpu.name, r)
    out = []
    for (model, source, precision), by_gpu in sorted(groups.items()):
        ref = by_gpu.get(REFERENCE_GPU)
        if ref is None:
            continue
        for gpu, r in sorted(by_gpu.items()):
            if gpu not in BLACKWELL_GPUS:
                continue
            measured = r.measured / ref.measured
            predicted = preds[r.row_id] / preds[ref.row_id]
            out.append({"model": model, "source": source, "precision": precision, "gpu": gpu,
                        "measured_ratio": measured, "predicted_ratio": predicted,
                        "predicted_over_measured": predicted / measured})
    return out


def source_flops_table(runs: list[Run], rows_by_id: dict[str, dict[str, str]], model: str) -> list[dict[str, Any]]:
    """The source's FLOPs per token (TFLOP/s over tokens/s) of each row of ``model`` (table 3)."""
    out = []
    for r in runs:
        raw = rows_by_id.get(r.row_id, {})
        tflops, tokens = raw.get("measured_tflops_per_gpu"), raw.get("measured_tokens_per_s_per_gpu")
        if r.model.name != model or not tflops or not tokens:
            continue
        out.append({"row_id": r.row_id, "source": r.source, "gpu": r.cluster.gpu.name,
                    "precision": r.training.precision.value, "seq_len": r.training.seq_len,
                    "source_gflop_per_token": float(tflops) * 1e3 / float(tokens),
                    "model_gflop_per_token": model_flops_per_token(r.model, r.training.seq_len) / 1e9})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b", help="model preset whose rows tables 1 and 3 list")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    path = runs_csv("megatron-bridge")
    runs, _, _ = load_corrected_runs(path)
    with open(path, newline="") as fh:
        rows_by_id = {row["id"]: row for row in csv.DictReader(fh)}
    picked = [row_table(r) for r in runs if r.model.name == args.model]
    preds = {r.row_id: predicted_metric(r, _step_s(r, _calib(r))) for r in runs if r.measured}
    scaling = scaling_table(runs, {k: v for k, v in preds.items() if v})
    flops = source_flops_table(runs, rows_by_id, args.model)
    if args.json:
        json.dump({"rows": picked, "scaling": scaling, "source_flops": flops}, sys.stdout, indent=1)
        return 0
    con = Console(width=200)
    t = Table(title=f"{args.model}: error, time the model lacks, one rate's closing factor")
    for col in ("id", "source", "gpu", "prec", "plan", "error", "missing s", "ms/layer/mb", "gemm x", "attn x", "hbm x"):
        t.add_column(col, justify="left" if col in ("id", "source", "gpu", "prec", "plan") else "right")
    for r in picked:
        f = r["closing_factor"]
        t.add_row(r["row_id"], r["source"].replace("Megatron-Bridge ", ""), r["gpu"], r["precision"], r["plan"][:44],
                  "-" if r["error"] is None else f"{r['error']:+.1%}",
                  "-" if r["missing_s"] is None else f"{r['missing_s']:+.2f}",
                  "-" if r["missing_ms_per_layer_microbatch"] is None else f"{r['missing_ms_per_layer_microbatch']:+.1f}",
                  *(f"{f[k]:.2f}" if f else "-" for k in RATES))
    con.print(t)
    t = Table(title=f"Blackwell over {REFERENCE_GPU}, same model, source and precision: median predicted / measured")
    for col in ("model", "rows", "median", "min", "max"):
        t.add_column(col, justify="left" if col == "model" else "right")
    by_model: dict[str, list[float]] = defaultdict(list)
    for s in scaling:
        by_model[s["model"]].append(s["predicted_over_measured"])
    for model, v in sorted(by_model.items()):
        t.add_row(model, str(len(v)), f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}")
    con.print(t)
    t = Table(title=f"{args.model}: the source's FLOPs per token (TFLOP/s / tokens/s) against the model's count")
    for col in ("source", "rows", "seq", "source GFLOP/token", "model GFLOP/token"):
        t.add_column(col, justify="left" if col == "source" else "right")
    by_source: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for f in flops:
        by_source[(f["source"], f["seq_len"])].append(f)
    for (source, seq), fs in sorted(by_source.items()):
        t.add_row(source, str(len(fs)), str(seq), f"{statistics.median(f['source_gflop_per_token'] for f in fs):.1f}",
                  f"{fs[0]['model_gflop_per_token']:.1f}")
    con.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
