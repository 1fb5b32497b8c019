"""The search's recommended plan against the configurations experts published (issue 15 item 5).

For every run of the shipped CSVs (``calibration``, ``megatron-bridge``; rows built by
``meshplan.calib.validate``), search the same job (model, GPUs, sequence, batch, precision) for
the run's stack (Megatron: Megatron-LM, Megatron-DeepSpeed and Megatron-Bridge all run the
Megatron-Core layouts) and estimate both plans with the same calibration as ``meshplan validate``.
``ratio`` = published step time / recommended step time under the model (1.34 reads "the search
claims 34% faster"); for every ratio above 1.15 the terms that make the difference
(``meshplan.report.attribution``). Writes docs/experts.md.

    PYTHONPATH=src python bench/bench_experts.py              # all rows (cached, see CACHE)
    PYTHONPATH=src python bench/bench_experts.py --sample 40  # every k-th row, for a quick look

Searches are cached in bench/results/experts_cache.json under a hash of the planner's source
(cost/, search/, spec/, calib/, targets.py, plan.py), so an unchanged model re-runs in seconds
and any change to it re-runs every search.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from meshplan.calib.validate import Run, load_runs, setting_calibration
from meshplan.cost import estimate
from meshplan.data.published import PUBLISHED_RUNS, runs_csv
from meshplan.errors import MeshplanError
from meshplan.report.attribution import attribute
from meshplan.cost.calibration import gpu_family
from meshplan.search.planner import search
from meshplan.search.robust import model_error, robust_choice
from meshplan.search.space import why_outside
from meshplan.targets import Target, search_options

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "meshplan"
CACHE = ROOT / "bench" / "results" / "experts_cache.json"
DOC = ROOT / "docs" / "experts.md"
HASHED = ("cost", "search", "spec", "calib", "targets.py", "plan.py")
LARGE_GAIN = 1.15
"""Ratios above this get their terms listed (the issue's threshold)."""
TOP_TERMS = 3
STACK = Target.MEGATRON


@dataclass(frozen=True)
class Row:
    csv: str
    row_id: str
    model: str
    gpu: str
    gpus: int
    seq: int
    batch: int
    published: str
    recommended: str | None
    ratio: float | None
    nominal_ratio: float | None
    """Against the nominally fastest plan that fits (before the robust choice)."""
    published_fits: bool
    outside: str | None
    terms: str
    term_deltas: dict


def source_hash() -> str:
    h = hashlib.sha256()
    for name in HASHED:
        path = SRC / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.is_file() and f.suffix in (".py", ".json"):
                h.update(str(f.relative_to(SRC)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def compare_run(csv: str, run: Run) -> Row:
    calib = setting_calibration(run, None, run.settings)
    opts = search_options(STACK, run.model, run.training)
    pub = estimate(run.model, run.cluster, run.training, run.plan, calib)
    outside = why_outside(run.model, run.training, run.cluster.num_gpus, run.plan, opts)
    res = search(run.model, run.cluster, run.training, calib=calib, options=opts)
    common = dict(csv=csv, row_id=run.row_id, model=run.model.name, gpu=run.cluster.gpu.name,
                  gpus=run.cluster.num_gpus, seq=run.training.seq_len, batch=run.training.global_batch,
                  published=run.plan.notation(), published_fits=pub.peak_memory_gib * 2**30 <= res.budget_bytes,
                  outside=outside)
    if res.recommended is None:
        return Row(**common, recommended=None, ratio=None, nominal_ratio=None, terms="nothing fits the budget",
                   term_deltas={})
    err = model_error(run.model.is_moe, run.training.precision.value, gpu_family(run.cluster.gpu))
    choice = robust_choice(res.frontier, res.budget_bytes, res.recommended_index, err)
    rec = estimate(run.model, run.cluster, run.training, res.frontier[choice.index].plan, calib)
    att = attribute(pub, rec)
    return Row(**common, recommended=rec.plan.notation(), ratio=pub.step_time_s / rec.step_time_s,
               nominal_ratio=pub.step_time_s / res.recommended.step_time_s,
               terms=att.explain(TOP_TERMS), term_deltas={t.term: t.delta_s / pub.step_time_s for t in att.terms})


def load_cache(key: str) -> dict:
    if CACHE.is_file():
        data = json.loads(CACHE.read_text())
        if data.get("source_hash") == key:
            return data["rows"]
    return {}


def run_all(sample: int | None) -> tuple[list[Row], list[tuple[str, str, str]], float]:
    key = source_hash()
    cache = load_cache(key)
    rows, skipped = [], []
    start = time.perf_counter()
    for csv in PUBLISHED_RUNS:
        runs, skip = load_runs(runs_csv(csv))
        skipped += [(csv, s.row_id, s.reason) for s in skip]
        if sample:
            runs = runs[::max(1, len(runs) // sample)]
        for run in runs:
            ident = f"{csv}:{run.row_id}:{run.plan.notation()}:{run.cluster.num_gpus}"
            if ident not in cache:
                try:
                    cache[ident] = compare_run(csv, run).__dict__
                except MeshplanError as exc:
                    skipped.append((csv, run.row_id, str(exc)))
                    continue
            rows.append(Row(**cache[ident]))
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps({"source_hash": key, "rows": cache}, indent=1))
    return rows, skipped, time.perf_counter() - start


def _quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    q = lambda f: xs[min(len(xs) - 1, int(f * (len(xs) - 1) + 0.5))]  # noqa: E731
    return f"median {statistics.median(xs):.2f}, p10 {q(0.1):.2f}, p90 {q(0.9):.2f}, max {xs[-1]:.2f}"


def render(rows: list[Row], skipped, elapsed_s: float, sample: int | None) -> str:
    out = ["# Recommended plans against the published ones", "",
           "Generated by `PYTHONPATH=src python bench/bench_experts.py` (do not edit by hand)"
           + (f"; SAMPLE of every k-th row (--sample {sample})" if sample else "") + ".", "",
           "For each published run of `meshplan validate --runs calibration` and `--runs megatron-bridge`, the "
           f"search's recommended plan (robust to the model's error, `meshplan.search.robust`, as `meshplan plan` recommends it) for the same job on the {STACK.value} stack, both estimated by the cost model "
           "with the calibration `validate` uses. ratio = published step time / recommended step time: above 1 "
           "the model claims the search's plan is faster. The model's own throughput error "
           "(`meshplan validate`) bounds how much of a ratio is real.", ""]
    ratios = [r.ratio for r in rows if r.ratio is not None]
    out += ["## Distribution", "", "| set | rows | ratio | nominal ratio (fastest that fits) | > 1.15 | < 1 (published faster) | outside the space |",
            "|---|---:|---|---|---:|---:|---:|"]
    for csv in PUBLISHED_RUNS:
        sub = [r for r in rows if r.csv == csv]
        rs = [r.ratio for r in sub if r.ratio is not None]
        nom = [r.nominal_ratio for r in sub if r.nominal_ratio is not None]
        out.append(f"| {csv} | {len(sub)} | {_quantiles(rs)} | {_quantiles(nom)} | {sum(x > LARGE_GAIN for x in rs)} | "
                   f"{sum(x < 1 - 1e-9 for x in rs)} | {sum(r.outside is not None for r in sub)} |")
    noms = [r.nominal_ratio for r in rows if r.nominal_ratio is not None]
    out.append(f"| all | {len(rows)} | {_quantiles(ratios)} | {_quantiles(noms)} | {sum(x > LARGE_GAIN for x in ratios)} | "
               f"{sum(x < 1 - 1e-9 for x in ratios)} | {sum(r.outside is not None for r in rows)} |")
    big = sorted((r for r in rows if r.ratio is not None and r.ratio > LARGE_GAIN), key=lambda r: -r.ratio)
    tally: dict[str, float] = {}
    for r in big:
        for term, d in r.term_deltas.items():
            if d < 0:
                tally[term] = tally.get(term, 0.0) - d
    out += ["", f"Where the {len(big)} large gains come from (sum over those rows of the saving per term, "
            "as a share of the published step):", "", "| term | summed saving (x published step) | rows where it is the largest |",
            "|---|---:|---:|"]
    firsts: dict[str, int] = {}
    for r in big:
        top = min(r.term_deltas.items(), key=lambda kv: kv[1])[0]
        firsts[top] = firsts.get(top, 0) + 1
    for term, s in sorted(tally.items(), key=lambda kv: -kv[1]):
        out.append(f"| {term} | {s:.2f} | {firsts.get(term, 0)} |")
    out += ["", f"## Ratios above {LARGE_GAIN}", "",
            "| set | row | model | GPUs | seq x batch | published | recommended | ratio | largest savings |",
            "|---|---|---|---:|---|---|---|---:|---|"]
    for r in big:
        out.append(f"| {r.csv} | {r.row_id} | {r.model} | {r.gpus} x {r.gpu} | {r.seq} x {r.batch} | "
                   f"`{r.published}`{'' if r.published_fits else ' (over budget)'} | `{r.recommended}` | "
                   f"{r.ratio:.2f} | {r.terms} |")
    outside = [r for r in rows if r.outside is not None]
    out += ["", "## Published plans outside the search space", "",
            "The search cannot propose these layouts (the rule of `search/space.py` each one breaks):", "",
            "| set | row | published | why |", "|---|---|---|---|"]
    out += [f"| {r.csv} | {r.row_id} | `{r.published}` | {r.outside} |" for r in outside] or ["| - | - | - | none |"]
    nothing = [r for r in rows if r.ratio is None]
    if nothing or skipped:
        out += ["", "## Not compared", "", "| set | row | why |", "|---|---|---|"]
        out += [f"| {r.csv} | {r.row_id} | {r.terms} |" for r in nothing]
        out += [f"| {c} | {i} | {why} |" for c, i, why in skipped]
    out += ["", f"Run time: {elapsed_s:.0f} s ({len(rows)} rows; cached searches are not re-run)."]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=None, help="About this many rows per CSV (every k-th).")
    ap.add_argument("--out", type=Path, default=DOC)
    args = ap.parse_args(argv)
    rows, skipped, elapsed = run_all(args.sample)
    args.out.write_text(render(rows, skipped, elapsed, args.sample))
    ratios = [r.ratio for r in rows if r.ratio is not None]
    print(f"{len(rows)} rows, ratio {_quantiles(ratios)}; wrote {args.out} in {elapsed:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
