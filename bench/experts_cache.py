"""The searches of bench/bench_experts.py, run job by job and cached in
bench/results/experts_cache.json under a hash of the planner's source (``run_all``), or read back
from the cache as they are (``render_cached``, ``--render-only``)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from meshplan.calib.validate import Run, load_runs
from meshplan.data.published import PUBLISHED_RUNS, runs_csv
from meshplan.errors import MeshplanError

from experts_compare import Row, compare_job  # bench/ is the script's directory, on sys.path
from experts_evidence import _runs_by_id, run_calibration  # bench/ is the script's directory, on sys.path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "meshplan"
CACHE = ROOT / "bench" / "results" / "experts_cache.json"
HASHED = ("cost", "search", "spec", "calib", "targets.py", "plan", "data")
log = logging.getLogger("bench_experts")


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


def job_key(run: Run, calib) -> str:
    """Rows with equal model, cluster, training and calibration share one search."""
    return hashlib.sha256(repr((run.model, run.cluster, run.training, calib)).encode()).hexdigest()[:16]


def load_cache(key: str) -> dict:
    if CACHE.is_file():
        data = json.loads(CACHE.read_text())
        if data.get("source_hash") == key:
            return data["rows"]
    return {}


def _ident(csv: str, run: Run) -> str:
    return f"{csv}:{run.row_id}:{run.plan.notation()}:{run.cluster.num_gpus}"


def _search_work(run: Run) -> float:
    """A rough size of the job's search, to start the largest first: MoE jobs (expert degrees and
    per-kind layer tables) far above dense ones, then more GPUs (more layouts)."""
    return (1.0 + run.model.moe_num_experts) * run.cluster.num_gpus


def _job(args: tuple[str, tuple[str, ...]]) -> tuple[list[Row], list[tuple[str, str, str]], float]:
    csv, ids = args
    runs = [_runs_by_id(csv)[i] for i in ids]
    start = time.process_time()
    try:
        return compare_job(csv, runs), [], time.process_time() - start
    except MeshplanError as exc:
        return [], [(csv, r.row_id, str(exc)) for r in runs], time.process_time() - start


def run_all(sample: int | None, workers: int, sets: tuple[str, ...] = tuple(PUBLISHED_RUNS),
            only: frozenset[str] = frozenset()) -> tuple[list[Row], list[tuple[str, str, str]], dict]:
    key = source_hash()
    cache = load_cache(key)
    rows, skipped, todo = [], [], []
    start = time.perf_counter()
    jobs_total = 0
    for csv in sets:
        runs, skip = load_runs(runs_csv(csv))
        skipped += [(csv, s.row_id, s.reason) for s in skip]
        if sample:
            runs = runs[::max(1, len(runs) // sample)]
        if only:
            runs = [r for r in runs if str(r.row_id) in only]
        groups: dict[str, list[Run]] = {}
        for run in runs:
            groups.setdefault(job_key(run, run_calibration(run)), []).append(run)
        jobs_total += len(groups)
        for group in groups.values():
            if all(_ident(csv, r) in cache for r in group):
                rows += [Row(**cache[_ident(csv, r)]) for r in group]
            else:
                todo.append((_search_work(group[0]), (csv, tuple(r.row_id for r in group))))
    # the largest searches first: with a few workers, a big MoE job left for last runs alone
    todo = [item for _, item in sorted(todo, key=lambda kv: -kv[0])]
    cpu_s = 0.0
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Serial() as pool:
        for n, (done, skip, spent) in enumerate(pool.map(_job, todo), 1):
            rows += done
            skipped += skip
            cpu_s += spent
            cache.update({f"{r.csv}:{r.row_id}:{r.published}:{r.gpus}": r.__dict__ for r in done})
            # written after every job, so an interrupted run resumes where it stopped
            CACHE.write_text(json.dumps({"source_hash": key, "rows": cache}, indent=1))
            log.info("job %d/%d searched (%.1f s CPU, %.0f s wall so far)", n, len(todo), spent,
                     time.perf_counter() - start)
    stats = dict(wall_s=time.perf_counter() - start, cpu_s=cpu_s, jobs=jobs_total, searched=len(todo),
                 workers=workers)
    if todo:  # the run that filled the cache, for --render-only to report
        CACHE.write_text(json.dumps({"source_hash": key, "rows": cache, "stats": stats}, indent=1))
    return rows, skipped, stats


def render_cached(sets: tuple[str, ...] = tuple(PUBLISHED_RUNS)) -> tuple[list[Row], list[tuple[str, str, str]], dict]:
    """The cached rows as they are (``--render-only``), with the rows the CSVs cannot build."""
    data = json.loads(CACHE.read_text())
    skipped = [(csv, s.row_id, s.reason) for csv in sets for s in load_runs(runs_csv(csv))[1]]
    gone = {(csv, row_id) for csv, row_id, _ in skipped}  # skipped since the cache was filled
    rows = [Row(**v) for v in data["rows"].values() if v["csv"] in sets and (v["csv"], v["row_id"]) not in gone]
    stale = data["source_hash"] != source_hash()
    jobs = {job_key(r, run_calibration(r)) for csv in sets
            for r in load_runs(runs_csv(csv))[0]}
    filled = data.get("stats", {})  # the run that filled the cache
    return rows, skipped, dict(wall_s=filled.get("wall_s", 0.0), cpu_s=filled.get("cpu_s", 0.0), jobs=len(jobs),
                               searched=filled.get("searched", 0), workers=filled.get("workers", 0), stale=stale,
                               cached=True)


class _Serial:
    """``ProcessPoolExecutor``'s ``map`` in this process (``--workers 1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def map(fn, items):
        return map(fn, items)
