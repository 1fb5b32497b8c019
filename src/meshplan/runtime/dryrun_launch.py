"""Run a dry run rank by rank, each in a process of its own (no torch imported here).

A fake process group makes one process rank r of W; torch keeps one default group per process, so
every simulated rank gets a fresh ``python -m meshplan.runtime.dryrun_worker`` and they run one
after another (the dry run is CPU-bound: on a shared host one at a time is the economical order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.plan import Job

RANK_SETS = ("first,last", "all")
THREADS_PER_DRY_RUN = 1
"""OpenMP threads of a worker: fake tensors do no arithmetic, so more threads buy nothing."""


def parse_ranks(spec: str, job: Job) -> list[int]:
    """'first,last' (rank 0, on the first pipeline stage, and the last rank, on the last), 'all',
    or a comma-separated list of ranks; refuses a rank outside the world."""
    world = job.plan.dims.world_size
    text = spec.strip().lower()
    if text == "first,last":
        return sorted({0, world - 1})
    if text == "all":
        return list(range(world))
    ranks: list[int] = []
    for part in text.split(","):
        if part in ("first", "last"):
            ranks.append(0 if part == "first" else world - 1)
            continue
        try:
            r = int(part)
        except ValueError:
            raise MeshplanError(f"--ranks: {part!r} is not a rank (use first,last, all or a list like 0,7)") from None
        if not 0 <= r < world:
            raise MeshplanError(f"--ranks: rank {r} is outside the plan's world of {world} ranks")
        ranks.append(r)
    return sorted(set(ranks))


def run_ranks(job: Job, ranks: list[int], *, steps: int = 1, timeout_s: float | None = None) -> list[dict]:
    """Simulate each of ``ranks`` in its own worker process; returns their RankResult dicts."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", str(THREADS_PER_DRY_RUN))
    results = []
    with tempfile.TemporaryDirectory(prefix="meshplan-dryrun-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(job.to_json())
        for r in ranks:
            out = Path(tmp) / f"rank{r}.json"
            cmd = [sys.executable, "-m", "meshplan.runtime.dryrun_worker", str(job_path), str(r),
                   str(steps), str(out)]
            try:
                proc = subprocess.run(cmd, env=env, timeout=timeout_s, text=True, capture_output=True, check=False)
            except subprocess.TimeoutExpired:
                raise MeshplanError(f"dry run of rank {r} did not finish within {timeout_s:.0f} s") from None
            if proc.returncode or not out.exists():
                raise MeshplanError(f"dry run of rank {r} failed: {_failure_line(proc.stderr)}")
            results.append(json.loads(out.read_text()))
    return results


def _failure_line(stderr: str) -> str:
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("error: "):
            return ln[len("error: "):]
    errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return errors[-1] if errors else (lines[-1] if lines else "no message")
