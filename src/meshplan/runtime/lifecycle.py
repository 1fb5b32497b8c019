"""How a run lives and dies: exit codes, parent death, stop requests, per-rank failure reports.

Pure Python (no torch): the launcher (``meshplan train``) and every worker rank share it.

- A worker dies with its launcher: the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG)``,
  Linux) SIGKILLs it when the process that started it exits, by any signal, SIGKILL included; where
  prctl is missing, a watchdog thread polls the parent pid instead.
- SIGTERM or SIGUSR1 (Slurm's warning before its deadline) asks for a stop at the next step
  boundary: the ranks agree on it inside the step's loss all-reduce, save a checkpoint and exit
  with :data:`EXIT_PREEMPTED`. The launcher passes the request on through a file in the run
  directory (not a second signal, which a rank that got the first one would read as "exit now").
  A second SIGTERM or SIGUSR1 to a rank exits it at once (the default action of the signal).
- A failing rank writes ``rank-N.error.json`` (exception type, message, time) and its traceback to
  ``rank-N.log``; the launcher reports the first one in one line.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from meshplan.errors import MeshplanError

EXIT_PREEMPTED = 75
"""A run stopped on request after saving a checkpoint: sysexits.h EX_TEMPFAIL ("try again later"),
what a scheduler's requeue logic expects of a job that can resume."""
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, the shell's convention."""
EXIT_FAILED = 1
"""A rank that raised an exception."""

DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
"""A collective waits this long for a lost peer before the run fails: longer than a checkpoint save
of a large model (its barriers wait on the slowest writer), a third of torch's own 30-minute
default. meshplan's launcher tears the group down sooner (procgroup.TEARDOWN_GRACE_S); this bounds
the wait under an external torchrun. ``meshplan train --collective-timeout-s`` sets it."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""Signals that mean "save and exit": SIGTERM (timeout, kill, schedulers), SIGUSR1 (Slurm
``--signal``, sent before the deadline)."""

RUN_DIR_ENV = "MESHPLAN_RUN_DIR"
"""Set by the launcher for its workers: the directory of the run's logs, reports and stop file."""
PARENT_PID_ENV = "MESHPLAN_LAUNCHER_PID"
"""Set by the launcher for its workers: a worker whose parent is no longer this pid exits."""
STOP_FILENAME = "stop"
"""In the run directory: written by the launcher on SIGTERM/SIGUSR1, holds the signal's name."""

SHOW_CURSOR = "\x1b[?25h"
"""ANSI escape (DECTCEM) that shows the terminal cursor again."""
PR_SET_PDEATHSIG = 1
"""prctl option number (linux/prctl.h)."""
WATCHDOG_PERIOD_S = 1.0
"""How often the fallback watchdog checks the parent (where prctl is missing)."""


class RunStopped(MeshplanError):
    """The run stopped on a SIGTERM/SIGUSR1 request: at a step boundary after a checkpoint
    (:data:`EXIT_PREEMPTED`), or at once on a second request (128 + the signal's number)."""

    def __init__(self, message: str, exit_code: int = EXIT_PREEMPTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def log_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"rank-{rank}.log"


def error_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"rank-{rank}.error.json"


# ---------------------------------------------------------------------------------- parent death

def die_with_parent() -> None:
    """SIGKILL this process when its parent exits; exit now if the parent is already gone.

    The parent is the launcher (``PARENT_PID_ENV``) or, run in place, an external torchrun agent.
    """
    expected = int(os.environ.get(PARENT_PID_ENV, "0")) or os.getppid()
    if not _set_pdeathsig(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(expected,), daemon=True, name="parent-watch").start()
    if os.getppid() != expected:  # it died before prctl took effect
        os._exit(EXIT_FAILED)


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(expected: int) -> None:
    while os.getppid() == expected:
        time.sleep(WATCHDOG_PERIOD_S)
    os.kill(os.getpid(), signal.SIGKILL)


def exit_quietly_on_interrupt() -> None:
    """Ctrl-C ends this rank at once with :data:`EXIT_INTERRUPTED`, printing nothing: the terminal
    sends SIGINT to every rank and the launcher prints the one line. (A KeyboardInterrupt could
    surface in the middle of another error's handling and print a traceback.)"""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _exit_interrupted)


def _exit_interrupted(_signum: int, _frame) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(SHOW_CURSOR)  # rank 0's progress bar hid it
        sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


# ---------------------------------------------------------------------------------- stop requests

class StopRequests:
    """This rank's view of a stop request: a SIGTERM/SIGUSR1 it received, or the launcher's stop file.

    ``install()`` sets the handlers (main thread only); the first signal records its name and
    restores the signal's default action, so a second one ends the process at once.
    """

    def __init__(self, run_dir: str | None) -> None:
        self.stop_file = Path(run_dir) / STOP_FILENAME if run_dir else None
        self.signal_name: str | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame) -> None:
        self.signal_name = signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)

    def requested(self) -> str | None:
        """The name of the signal that asked for a stop, or None."""
        if self.signal_name is None and self.stop_file is not None and self.stop_file.exists():
            self.signal_name = self.stop_file.read_text().strip() or "stop request"
        return self.signal_name

    def uninstall(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)


def request_stop(run_dir: str | Path, signal_name: str) -> None:
    """Launcher side: ask every rank to stop at the next step boundary (atomic write)."""
    path = Path(run_dir) / STOP_FILENAME
    tmp = path.with_suffix(".part")
    tmp.write_text(signal_name + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- failure reports

@dataclass(frozen=True, kw_only=True)
class RankError:
    rank: int
    type_name: str
    message: str
    time_s: float
    """Wall-clock time of the failure (time.time()), to find the first failing rank."""
    user_error: bool
    """A MeshplanError: its message is written for users and printed alone."""


def write_error_report(run_dir: str | Path, rank: int, exc: BaseException) -> None:
    """Record this rank's exception: one JSON report, and the full traceback in its log file."""
    report = {"rank": rank, "type_name": type(exc).__name__, "message": _first_line(exc),
              "time_s": time.time(), "user_error": isinstance(exc, MeshplanError)}
    path = error_path(run_dir, rank)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)
    with open(log_path(run_dir, rank), "a") as fh:
        traceback.print_exception(exc, file=fh)


def read_error_reports(run_dir: str | Path) -> list[RankError]:
    """Every rank's report, first failure first."""
    reports = []
    for path in Path(run_dir).glob("rank-*.error.json"):
        try:
            reports.append(RankError(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a rank killed while writing it: the launcher reports it by its exit status
    return sorted(reports, key=lambda r: r.time_s)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
