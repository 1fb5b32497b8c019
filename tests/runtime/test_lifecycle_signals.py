"""lifecycle.py without torch: stop requests from signals and from the launcher's file, and a
process that dies with its parent (plain Python processes, a second or two)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from meshplan.runtime.lifecycle import STOP_FILENAME, StopRequests, request_stop

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_is_recorded_and_a_second_one_would_kill(sig):
    stops = StopRequests(None)
    stops.install()
    try:
        assert stops.requested() is None
        os.kill(os.getpid(), sig)
        assert stops.requested() == sig.name
        assert signal.getsignal(sig) == signal.SIG_DFL  # the next one ends the process at once
    finally:
        stops.uninstall()


def test_the_launchers_stop_file_is_a_request(tmp_path):
    stops = StopRequests(str(tmp_path))
    assert stops.requested() is None
    request_stop(tmp_path, "SIGUSR1")
    assert (tmp_path / STOP_FILENAME).read_text() == "SIGUSR1\n"
    assert stops.requested() == "SIGUSR1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_worker_dies_with_its_parent_even_by_sigkill(tmp_path):
    """parent -> child; the child calls die_with_parent and sleeps; SIGKILL the parent: the child
    is gone within a second (no launcher code runs after a SIGKILL)."""
    pid_file = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import os, time
        from meshplan.runtime.lifecycle import die_with_parent
        die_with_parent()
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {child!r}])
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(child_pid)
    if alive:
        os.kill(child_pid, signal.SIGKILL)
    assert not alive


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
