"""Every rank meshplan's launcher starts sees the allocator setting the memory model's meshplan
stack assumes (meshplan/launch_env.py), through the real process group."""

from __future__ import annotations

import sys

from meshplan.launch_env import ALLOC_CONF_ENV, EXPANDABLE_SEGMENTS
from meshplan.runtime.launch import _worker_env
from meshplan.runtime.procgroup import run_group

WRONG_SETTING = 3


def test_each_rank_starts_with_expandable_segments(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    check = (f"import os, sys; sys.exit(0 if os.environ.get({ALLOC_CONF_ENV!r}) == {EXPANDABLE_SEGMENTS!r} "
             f"else {WRONG_SETTING})")
    result = run_group([sys.executable, "-c", check], world=2, run_dir=tmp_path, env=_worker_env(),
                       timeout_s=60, capture=True)
    assert result.returncodes == (0, 0)
