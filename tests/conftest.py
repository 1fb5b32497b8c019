import os

import pytest

# Keep hypothesis quick and deterministic on CI's 2 cores.
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

PROCESS_TESTS_DIR = "tests/runtime/"
"""Tests that start training, dry-run or profiling processes (gloo ranks, torch in each)."""


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own choice; optional without xdist
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n 2 --dist loadfile`` (the README's command): one work unit per test file, except
    that every file under tests/runtime/ is one unit, so the multi-process tests run one at a time on
    one worker (as without xdist: no two launches share the 2 cores) while the other worker takes
    the single-process files. A file's module-scoped fixtures are built once, on one worker.
    xdist's own ``--dist loadgroup`` would do this by marks, but it renames node ids through an
    attribute pytest 9 no longer reads, so its groups are ignored."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ProcessTestsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return PROCESS_TESTS_DIR if path.startswith(PROCESS_TESTS_DIR) else path

    return ProcessTestsTogether(config, log)
