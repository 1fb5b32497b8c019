"""Start the workers: one process per rank on this machine, or in-process under an existing launch.

Pure Python (no torch import at module level), so the CLI can check a plan and launch without
loading torch. How the processes live and die: ``procgroup`` (launcher) and ``lifecycle`` (both).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.ckpt_meta import latest_checkpoint
from meshplan.errors import MeshplanError
from meshplan.launch_env import with_launcher_env
from meshplan.plan import Job
from meshplan.runtime.lifecycle import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    RunStopped,
    log_path,
    read_error_reports,
)
from meshplan.runtime.procgroup import GroupResult, is_failure, run_group

if TYPE_CHECKING:
    from meshplan.runtime.train_config import TrainConfig

THREADS_PER_CPU_RANK = 1
"""OpenMP threads per CPU rank: the ranks already use the cores (torchrun's own default)."""
PROCS_PER_CORE = 4
"""At most this many CPU ranks per core: beyond it a run is all context switches (and a plan for
1024 GPUs would start 1024 processes). Override with ``MESHPLAN_MAX_PROCS``."""
MIN_PROCS_CAP = 8
"""The cap is never below this: the 8-rank layouts of the parity tests (pp2 x fsdp4) run on a
2-core CI machine."""
MAX_PROCS_ENV = "MESHPLAN_MAX_PROCS"


def under_torchrun() -> bool:
    """True inside torchrun or another rendezvous that set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def max_cpu_procs() -> int:
    """The most CPU ranks this machine starts: ``MESHPLAN_MAX_PROCS``, else PROCS_PER_CORE per core."""
    raw = os.environ.get(MAX_PROCS_ENV)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise MeshplanError(f"{MAX_PROCS_ENV} must be a positive integer, got {raw!r}")
        return value
    return max(MIN_PROCS_CAP, PROCS_PER_CORE * (os.cpu_count() or 1))


def visible_gpus() -> int:
    """CUDA devices this process sees (imports torch)."""
    import torch

    return torch.cuda.device_count()


def check_machine(job: Job, plan_file: str | Path, visible_gpus: int) -> None:
    """Refuse a plan this machine cannot start: a GPU plan without GPUs, more ranks than GPUs, or
    more CPU ranks than :func:`max_cpu_procs`. Under an external torchrun only the first applies."""
    world, gpu = job.plan.dims.world_size, job.cluster.gpu.name
    if gpu != "cpu" and visible_gpus == 0:
        raise MeshplanError(
            f"{plan_file} is a plan for {world} {gpu} GPUs and this machine has no GPU: plan for this "
            f"machine with `meshplan plan ... --cluster cpu`, or check the plan without GPUs with "
            f"`meshplan train --plan {plan_file} --dry-run`")
    if under_torchrun():
        return
    if gpu != "cpu" and world > visible_gpus:
        raise MeshplanError(
            f"{plan_file} needs {world} GPUs and this machine has {visible_gpus}: on several machines, "
            f"start `meshplan train` under torchrun on each (it then runs in place)")
    cap = max_cpu_procs()
    if gpu == "cpu" and world > cap:
        raise MeshplanError(
            f"{plan_file} needs {world} CPU processes and this machine runs at most {cap} "
            f"({os.cpu_count()} cores x {PROCS_PER_CORE}, at least {MIN_PROCS_CAP}): plan for fewer, "
            f"or set {MAX_PROCS_ENV}={world} to start them anyway")


def run_payload(runs: list[tuple[Job, "TrainConfig"]]) -> list[dict]:
    return [{"job": job.to_dict(), "config": asdict(cfg)} for job, cfg in runs]


def launch(runs: list[tuple[Job, "TrainConfig"]], *, timeout_s: float | None = None,
           capture: bool = False) -> None:
    """Run the jobs (all of one world size). Under torchrun: in this process; else start the ranks.

    ``capture``: rank 0 writes to its log file too, not to this terminal. Raises MeshplanError with
    one line when a rank fails (the first failing rank, where its log is, the checkpoint to resume
    from), RunStopped when the run stopped on SIGTERM/SIGUSR1. The run directory with the ranks'
    logs is kept after a failure only.
    """
    sizes = {job.plan.dims.world_size for job, _ in runs}
    if len(sizes) != 1:
        raise MeshplanError(f"runs in one launch need one world size, got {sorted(sizes)}")
    world = sizes.pop()
    ckpt_dirs = [cfg.checkpoint_dir for _, cfg in runs if cfg.checkpoint_dir]
    run_dir = Path(tempfile.mkdtemp(prefix="meshplan-run-"))
    keep = False
    try:
        payload = run_dir / "runs.json"
        payload.write_text(json.dumps(run_payload(runs)))
        if under_torchrun():
            from meshplan.runtime.worker import run_in_place

            run_in_place(str(payload))
            return
        cmd = [sys.executable, "-m", "meshplan.runtime.worker", str(payload)]
        result = run_group(cmd, world=world, run_dir=run_dir, env=_worker_env(), timeout_s=timeout_s,
                           capture=capture)
        failed = [c for c in result.returncodes if is_failure(c)]
        if failed and all(c == EXIT_INTERRUPTED for c in failed):
            # Ctrl-C reached the ranks (their handler exits 130) but not this process: one started
            # with SIGINT ignored (a background job of a non-interactive shell) raises no
            # KeyboardInterrupt. The run was interrupted, not failed.
            raise KeyboardInterrupt
        if result.first_failed is not None:
            keep = True
            raise MeshplanError(failure_line(result, run_dir, ckpt_dirs[0] if ckpt_dirs else None))
        if EXIT_PREEMPTED in result.returncodes:
            reports = [r for r in read_error_reports(run_dir) if r.type_name == RunStopped.__name__]
            first = min(reports, key=lambda r: r.rank) if reports else None
            raise RunStopped(first.message if first else f"stopped by {result.stop_signal or 'a stop request'}")
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def _worker_env() -> dict[str, str]:
    """This process's environment for the ranks: meshplan on the path, one OpenMP thread, the
    launcher's allocator settings (meshplan/launch_env.py) where the user set none."""
    env = with_launcher_env(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # so workers import this meshplan
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", str(THREADS_PER_CPU_RANK))
    return env


def failure_line(result: GroupResult, run_dir: Path, checkpoint_dir: str | None) -> str:
    """One line: the first failing rank and why, where its log is, and where to resume from.

    A rank killed by a signal the launcher did not send is the cause (the others' errors follow from
    losing it); otherwise the earliest exception any rank reported.
    """
    codes = result.returncodes
    lost = [r for r, c in enumerate(codes) if c < 0 and r not in result.killed_by_launcher]
    first = result.first_failed if result.first_failed in lost or not lost else lost[0]
    code = codes[first]
    reports = read_error_reports(run_dir)
    if lost:
        line = f"rank {first} died ({_signal_name(-code)}); logs: {run_dir}"
    elif reports:
        r = reports[0]
        where = f"full log: {log_path(run_dir, r.rank)}"
        line = (f"{r.message} ({where})" if r.user_error
                else f"rank {r.rank} failed: {r.type_name}: {r.message} ({where})")
    else:
        line = f"rank {first} exited with code {code} (full log: {log_path(run_dir, first)})"
    if checkpoint_dir:
        latest = latest_checkpoint(checkpoint_dir)
        line += (f"; latest complete checkpoint: {latest} (continue with --resume)" if latest
                 else f"; no complete checkpoint in {checkpoint_dir} yet")
    return line


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
