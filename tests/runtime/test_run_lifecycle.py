"""A run dies cleanly (issue 19), through `meshplan train` on 2 CPU ranks (gloo).

One uninterrupted fsdp2 run (6 steps, a checkpoint every 2) is the reference. Then:
- SIGKILL of `meshplan train` in the middle of step 3, then (resumed) inside the step-4 save: no
  process of the run is left 10 s later, and the second resume reproduces the reference losses;
- SIGTERM in the middle of step 3: a checkpoint at step 3, exit 75, one line; the resume is exact;
- SIGTERM then a second SIGTERM while a rank is stuck in a save: exits at once, the latest
  complete checkpoint stays intact;
- SIGKILL of one rank: the run ends within the launcher's grace with one line naming the rank
  and the checkpoint to resume from;
- Ctrl-C (SIGINT to the process group): exit 130, nothing printed, no process left;
- a loss that overflows (an absurd learning rate) stops the run naming the step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _ckpt_helpers import TIMEOUT_S, _env, make_job, read_losses, run, train_cmd
from meshplan import ckpt_meta
from meshplan.runtime.checkpoint import PAUSE_IN_STEP_ENV, SLEEP_IN_SAVE_ENV
from meshplan.runtime.lifecycle import EXIT_PREEMPTED
from meshplan.runtime.procgroup import TEARDOWN_GRACE_S

pytestmark = pytest.mark.runtime

STEPS, EVERY = 6, 2
GONE_WITHIN_S = 10.0
"""Issue 19: every rank exits within a few seconds of its launcher; the test allows 10."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    job = make_job(tmp / "fsdp2.json", dp_shard=2)
    r = run(train_cmd(job, tmp / "ckpt", tmp / "log.jsonl", steps=STEPS, every=EVERY))
    assert r.returncode == 0, r.stderr[-6000:]
    return {"job": job, "losses": read_losses(tmp / "log.jsonl")}


def _start(cmd: list[str], env_extra: dict) -> subprocess.Popen:
    """`meshplan train` in a session of its own (so the test can signal its process group as a
    terminal does)."""
    return subprocess.Popen(cmd, env=_env(env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen) -> int:
    """Wait until a test hook wrote its pid to ``path``; returns the pid."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (path.exists() and path.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run never reached the hook:\n{proc.communicate()[1][-4000:]}")
        time.sleep(0.1)
    return int(path.read_text())


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    """Running (a zombie left for a non-reaping init counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _assert_gone(pids: list[int], within_s: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    for p in left:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their launcher by {within_s} s"


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr[-4000:]
    assert "Traceback" not in stderr
    return lines[0]


def _complete(ckpt: Path) -> list[int]:
    return [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)]


def test_sigkill_of_launcher_mid_step_and_mid_save(reference, tmp_path):
    job, ckpt = reference["job"], tmp_path / "ckpt"
    logs = [tmp_path / f"log{i}.jsonl" for i in range(3)]

    # 1. SIGKILL of `meshplan train` while rank 1 is in the middle of step 3.
    hook = tmp_path / "paused.pid"
    proc = _start(train_cmd(job, ckpt, logs[0], steps=STEPS, every=EVERY), {PAUSE_IN_STEP_ENV: f"1:3:{hook}"})
    _wait_for(hook, proc)
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    proc.kill()
    proc.communicate()
    _assert_gone(ranks)
    assert _complete(ckpt) == [2]

    # 2. resumed from step 2; SIGKILL of `meshplan train` while rank 1 is inside the step-4 save.
    proc = _start(train_cmd(job, ckpt, logs[1], steps=STEPS, every=EVERY, resume=True),
                  {SLEEP_IN_SAVE_ENV: "1:4"})
    _wait_for(ckpt / "step-000004.tmp" / "sleeping-rank1.pid", proc)
    ranks = _children(proc.pid)
    proc.kill()
    proc.communicate()
    _assert_gone(ranks)
    assert _complete(ckpt) == [2]  # the interrupted save never counts, nothing wrote after the kill

    # 3. resume again and finish: the losses of the uninterrupted run, exactly.
    r = run(train_cmd(job, ckpt, logs[2], steps=STEPS, every=EVERY, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    assert sorted(read_losses(logs[2])) == [3, 4, 5, 6]
    assert read_losses(*logs) == reference["losses"]


def test_sigterm_checkpoints_at_the_next_step_and_resumes_exactly(reference, tmp_path):
    job, ckpt = reference["job"], tmp_path / "ckpt"
    logs = [tmp_path / "log0.jsonl", tmp_path / "log1.jsonl"]
    hook = tmp_path / "paused.pid"
    proc = _start(train_cmd(job, ckpt, logs[0], steps=STEPS, every=0), {PAUSE_IN_STEP_ENV: f"1:3:{hook}"})
    _wait_for(hook, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == EXIT_PREEMPTED, err[-4000:]
    assert _complete(ckpt) == [3]  # saved at the end of the step the signal arrived in
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM after step 3: checkpoint") and "step-000003" in last, err
    assert "Traceback" not in err
    assert sorted(read_losses(logs[0])) == [1, 2, 3]

    r = run(train_cmd(job, ckpt, logs[1], steps=STEPS, every=0, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    assert read_losses(*logs) == reference["losses"]


def test_second_sigterm_exits_at_once_and_keeps_the_checkpoint(reference, tmp_path):
    job, ckpt = reference["job"], tmp_path / "ckpt"
    proc = _start(train_cmd(job, ckpt, tmp_path / "log.jsonl", steps=STEPS, every=EVERY),
                  {SLEEP_IN_SAVE_ENV: "1:4"})
    _wait_for(ckpt / "step-000004.tmp" / "sleeping-rank1.pid", proc)  # stuck in a save: the stop waits
    ranks = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert time.monotonic() - start < GONE_WITHIN_S
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]
    assert "stopped at once by a second SIGTERM" in err
    _assert_gone(ranks)
    assert _complete(ckpt) == [2]
    ckpt_meta.load_meta(ckpt)  # its files are all there with their committed sizes


def test_lost_rank_ends_the_run_with_one_line(reference, tmp_path):
    job, ckpt = reference["job"], tmp_path / "ckpt"
    hook = tmp_path / "paused.pid"
    proc = _start(train_cmd(job, ckpt, tmp_path / "log.jsonl", steps=STEPS, every=EVERY),
                  {PAUSE_IN_STEP_ENV: f"1:3:{hook}", "TMPDIR": str(tmp_path)})  # the kept run directory
    os.kill(_wait_for(hook, proc), signal.SIGKILL)
    start = time.monotonic()
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert time.monotonic() - start < TEARDOWN_GRACE_S + GONE_WITHIN_S
    assert proc.returncode == 2
    line = _one_line(err)
    assert line.startswith("error: rank 1 died (SIGKILL)"), line
    assert f"latest complete checkpoint: {ckpt / 'step-000002'} (continue with --resume)" in line
    [run_dir] = tmp_path.glob("meshplan-run-*")  # kept after a failure, named in the line
    assert f"logs: {run_dir}" in line and (run_dir / "rank-1.log").exists()


def test_ctrl_c_stops_every_rank_quietly(reference, tmp_path):
    hook = tmp_path / "paused.pid"
    proc = _start(train_cmd(reference["job"], tmp_path / "ckpt", tmp_path / "log.jsonl", steps=STEPS, every=0),
                  {PAUSE_IN_STEP_ENV: f"1:2:{hook}"})
    _wait_for(hook, proc)
    ranks = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, err[-4000:]
    assert err.strip() in ("", "interrupted"), err[-4000:]  # typer exits 130 silently on Ctrl-C
    _assert_gone(ranks)


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step(tmp_path):
    """AdamW's first update moves every weight by about lr = 1e30: step 2's logits overflow."""
    job = make_job(tmp_path / "one.json")
    r = run([sys.executable, "-m", "meshplan", "train", "--plan", str(job), "--steps", "4", "--lr", "1e30",
             "--json"], {"TMPDIR": str(tmp_path)})  # where the failed run's logs are kept
    assert r.returncode == 2, r.stderr[-4000:]
    line = _one_line(r.stderr)
    assert line.startswith("error: the loss is ") and " at step 2: training diverged" in line, line
    assert r.stdout == ""
