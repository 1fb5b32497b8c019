"""Start the workers: torchrun with the plan's world size, or in-process under an existing launch.

Pure Python (no torch import), so the CLI can check a plan and launch without loading torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.plan import Job

if TYPE_CHECKING:
    from meshplan.runtime.train import TrainConfig

THREADS_PER_CPU_RANK = 1
"""OpenMP threads per CPU rank: the ranks already use the cores (torchrun's own default)."""


def under_torchrun() -> bool:
    """True inside torchrun or another rendezvous that set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_payload(runs: list[tuple[Job, "TrainConfig"]]) -> list[dict]:
    return [{"job": job.to_dict(), "config": asdict(cfg)} for job, cfg in runs]


def launch(runs: list[tuple[Job, "TrainConfig"]], *, timeout_s: float | None = None,
           capture: bool = False) -> subprocess.CompletedProcess | None:
    """Run the jobs (all of one world size). Under torchrun: in this process; else spawn torchrun.

    Returns the torchrun CompletedProcess (None when run in-process); raises MeshplanError when
    the workers fail, with the first error line they printed.
    """
    sizes = {job.plan.dims.world_size for job, _ in runs}
    if len(sizes) != 1:
        raise MeshplanError(f"runs in one launch need one world size, got {sorted(sizes)}")
    world = sizes.pop()
    with tempfile.TemporaryDirectory(prefix="meshplan-") as tmp:
        payload = Path(tmp) / "runs.json"
        payload.write_text(json.dumps(run_payload(runs)))
        if under_torchrun():
            from meshplan.runtime.worker import main

            if main([str(payload)]):
                raise MeshplanError("training failed (see the messages above)")
            return None
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world}", "-m", "meshplan.runtime.worker", str(payload)]
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # so workers import this meshplan
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", str(THREADS_PER_CPU_RANK))
        env.setdefault("LOGLEVEL", "ERROR")  # torchrun's own chatter
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout_s, text=True,
                                  capture_output=capture)
        except subprocess.TimeoutExpired:
            raise MeshplanError(f"training did not finish within {timeout_s:.0f} s") from None
        if proc.returncode:
            raise MeshplanError(_failure_line(proc))
        return proc


def _failure_line(proc: subprocess.CompletedProcess) -> str:
    text = proc.stderr or ""
    for line in text.splitlines():
        if line.startswith("error: "):
            return line[len("error: "):]
    # torchrun ends with its own ChildFailedError; the worker's exception is the line before it.
    tail = [ln for ln in text.splitlines() if "Error" in ln and "ChildFailedError" not in ln]
    return f"training failed (exit {proc.returncode})" + (f": {tail[-1].strip()}" if tail else "")
