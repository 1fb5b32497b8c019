"""Start one worker process per rank on this machine, watch them, and tear the group down.

Pure Python (no torch). This replaces ``torchrun --standalone`` for single-machine runs because a
run must stop as one: torchrun puts each worker in a session of its own (a signal to the
launcher's process group misses them), passes SIGUSR1 on as a kill, and prints one traceback per
rank. Here the workers stay in the launcher's process group (Ctrl-C reaches every rank), die with
it (``lifecycle.die_with_parent``), and the launcher:

- on SIGTERM/SIGUSR1, asks every rank to save and stop at the next step (``lifecycle.request_stop``);
  on a second one, SIGKILLs them all and raises at once;
- when one rank fails or dies, gives the others :data:`TEARDOWN_GRACE_S` to stop on their own
  (gloo fails a collective whose peer closed its connection), then SIGKILLs the rest: a lost rank
  never leaves the others waiting in a collective;
- on Ctrl-C, lets the ranks exit quietly, then SIGKILLs what is left.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.runtime.lifecycle import (
    EXIT_PREEMPTED, PARENT_PID_ENV, RUN_DIR_ENV, STOP_SIGNALS, RunStopped, log_path, request_stop,
)

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the launcher checks its workers."""
TEARDOWN_GRACE_S = 5.0
"""After a rank fails: time for the others to notice the lost peer, report and exit on their own
before they are SIGKILLed. Bounds how long a lost rank can keep the rest waiting."""
INTERRUPT_GRACE_S = 3.0
"""After Ctrl-C: time for the ranks to exit quietly (close the progress bar) before SIGKILL."""
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class GroupResult:
    returncodes: tuple[int, ...]
    """Per rank: 0, a worker exit code, or -N when killed by signal N."""
    first_failed: int | None
    """The rank whose abnormal end the launcher saw first (None when none failed)."""
    killed_by_launcher: frozenset[int]
    """Ranks the launcher SIGKILLed while tearing the group down."""
    stop_signal: str | None
    """The stop request (SIGTERM/SIGUSR1) the launcher received, if any."""


def free_port() -> int:
    """A TCP port free now on localhost for the rendezvous store (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def rank_env(base: dict[str, str], *, rank: int, world: int, port: int, run_dir: Path) -> dict[str, str]:
    """The environment torch's ``env://`` rendezvous reads (as torchrun sets it), plus ours."""
    env = dict(base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port))
    env[RUN_DIR_ENV] = str(run_dir)
    env[PARENT_PID_ENV] = str(os.getpid())
    return env


def is_failure(code: int | None) -> bool:
    return code is not None and code not in (0, EXIT_PREEMPTED)


def run_group(cmd: list[str], *, world: int, run_dir: Path, env: dict[str, str],
              timeout_s: float | None = None, capture: bool = False) -> GroupResult:
    """Run ``cmd`` as ranks 0..world-1 and wait for all of them. Rank 0 keeps this terminal (its
    progress bar) unless ``capture``; every other rank writes to ``run_dir/rank-N.log``."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    watch = _SignalWatch(run_dir)
    watch.install()
    killed: set[int] = set()
    try:
        for rank in range(world):
            out = None if rank == 0 and not capture else open(log_path(run_dir, rank), "ab")
            try:
                procs.append(subprocess.Popen(cmd, env=rank_env(env, rank=rank, world=world, port=port,
                                                                 run_dir=run_dir),
                                              stdout=out, stderr=subprocess.STDOUT if out else None))
            finally:
                if out is not None:
                    out.close()
        first_failed = _watch(procs, watch, timeout_s, killed)
    except KeyboardInterrupt:
        _interrupt(procs)
        raise
    finally:
        watch.uninstall()
        killed |= _kill_all(procs)
    return GroupResult(returncodes=tuple(p.returncode for p in procs), first_failed=first_failed,
                       killed_by_launcher=frozenset(killed), stop_signal=watch.first)


def _watch(procs: list[subprocess.Popen], watch: "_SignalWatch", timeout_s: float | None,
           killed: set[int]) -> int | None:
    """Wait for every rank; returns the first that failed. Tears the group down on a failure."""
    start = time.monotonic()
    first_failed, failed_at = None, None
    while True:
        codes = [p.poll() for p in procs]
        now = time.monotonic()
        if first_failed is None:
            first_failed = next((r for r, c in enumerate(codes) if is_failure(c)), None)
            failed_at = now if first_failed is not None else None
        if all(c is not None for c in codes):
            return first_failed
        if failed_at is not None and now - failed_at > TEARDOWN_GRACE_S:
            killed |= _kill_all(procs)
            return first_failed
        if timeout_s is not None and now - start > timeout_s:
            killed |= _kill_all(procs)
            raise MeshplanError(f"training did not finish within {timeout_s:.0f} s")
        if watch.second is not None:
            _kill_all(procs)
            raise RunStopped(f"stopped at once by a second {watch.second}", 128 + watch.second_number)
        time.sleep(POLL_S)


def _interrupt(procs: list[subprocess.Popen]) -> None:
    """Ctrl-C: the terminal sent SIGINT to every rank already (one process group); pass it on for a
    SIGINT sent to the launcher alone, then give the ranks a moment to exit quietly."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during this short wait
    try:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(POLL_S)
    finally:
        signal.signal(signal.SIGINT, previous)


def _kill_all(procs: list[subprocess.Popen]) -> set[int]:
    """SIGKILL every rank still running and reap them all; returns the ranks it killed."""
    killed = set()
    for rank, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            killed.add(rank)
    for p in procs:
        p.wait()
    return killed


class _SignalWatch:
    """The launcher's SIGTERM/SIGUSR1 handlers: the first asks the ranks to stop, the second is kept
    for the watch loop to kill them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.first: str | None = None
        self.second: str | None = None
        self.second_number = 0
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.first is None:
            self.first = name
            request_stop(self.run_dir, name)
            log.warning(
                "%s: saving a checkpoint at the next step boundary, then stopping (send it again to "
                "stop at once)", name)
        else:
            self.second, self.second_number = name, signum
