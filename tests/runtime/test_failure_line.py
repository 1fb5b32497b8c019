"""The one line `meshplan train` prints when ranks fail (no processes: reports written by hand)."""

from __future__ import annotations

import json

from meshplan.errors import MeshplanError
from meshplan.runtime.launch import failure_line
from meshplan.runtime.lifecycle import error_path, read_error_reports, write_error_report
from meshplan.runtime.procgroup import GroupResult


def _result(codes, first, killed=()):
    return GroupResult(returncodes=tuple(codes), first_failed=first, killed_by_launcher=frozenset(killed),
                       stop_signal=None)


def _report(run_dir, rank, type_name, message, time_s, user_error=False):
    error_path(run_dir, rank).write_text(json.dumps(
        {"rank": rank, "type_name": type_name, "message": message, "time_s": time_s, "user_error": user_error}))


def test_a_rank_killed_by_a_signal_is_the_cause_even_when_a_peer_exited_first(tmp_path):
    # rank 0 saw the closed connection and exited before the launcher noticed rank 1's death
    _report(tmp_path, 0, "RuntimeError", "Connection closed by peer", 1.0)
    line = failure_line(_result([1, -9], first=0), tmp_path, None)
    assert line == f"rank 1 died (SIGKILL); logs: {tmp_path}"


def test_the_earliest_exception_is_reported_with_its_log(tmp_path):
    _report(tmp_path, 0, "RuntimeError", "Connection closed by peer", 2.0)
    _report(tmp_path, 1, "ValueError", "bad shard", 1.0)
    line = failure_line(_result([1, -9], first=0, killed=[1]), tmp_path, None)  # rank 1 killed by us
    assert line == f"rank 1 failed: ValueError: bad shard (full log: {tmp_path / 'rank-1.log'})"


def test_a_user_error_prints_its_message_alone(tmp_path):
    try:
        raise MeshplanError("the loss is nan at step 2: training diverged\nsecond line")
    except MeshplanError as exc:
        write_error_report(tmp_path, 0, exc)
    assert "Traceback" in (tmp_path / "rank-0.log").read_text()  # the full story is in the log
    [report] = read_error_reports(tmp_path)
    assert report.user_error and report.message == "the loss is nan at step 2: training diverged"
    line = failure_line(_result([2], first=0), tmp_path, None)
    assert line.startswith("the loss is nan at step 2: training diverged (full log: ")


def test_no_report_names_the_exit_code_and_the_checkpoint_state(tmp_path):
    ckpt = tmp_path / "ckpt"
    line = failure_line(_result([0, 3], first=1), tmp_path, str(ckpt))
    assert line == (f"rank 1 exited with code 3 (full log: {tmp_path / 'rank-1.log'}); "
                    f"no complete checkpoint in {ckpt} yet")


def test_a_half_written_report_is_skipped(tmp_path):
    error_path(tmp_path, 0).write_text('{"rank": 0, "type_')
    assert read_error_reports(tmp_path) == []
