"""Fixtures of the fuzz files (tests/cli/test_fuzz_*.py, one per kind of input; their helpers and
good forms are in _fuzz_harness.py). Each is used by name only: ``no_processes`` through each fuzz
file's ``pytestmark``."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fuzz_harness import example_cluster as _example_cluster
from _fuzz_harness import install_tripwires, make_checkpoint, moe_job, published_rows


@pytest.fixture()
def no_processes(monkeypatch, tmp_path):
    """No process starts (tripwires), and whatever a command writes stays out of the repository."""
    install_tripwires(monkeypatch)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def moe_job_dict() -> dict:
    return moe_job()


@pytest.fixture(scope="module")
def example_cluster() -> dict:
    return _example_cluster()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def runs_rows() -> list[tuple[list[str], dict[str, str]]]:
    return published_rows()
