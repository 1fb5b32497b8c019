import os

import pytest

# Keep hypothesis quick and deterministic on CI's 2 cores.
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

PROCESS_TESTS_DIR = "tests/runtime/"
"""Tests that start training or profiling processes (gloo ranks on free ports, torch in each)."""
DRY_RUN_FILES = ("tests/runtime/test_dryrun.py", "tests/runtime/test_vocab_parallel_dryrun.py")
"""Runtime tests that only dry-run: one single-threaded worker process at a time on torch's fake
process group (no port, no gloo), the longest files of the suite; each is a work unit of its own."""


def _unit(nodeid: str) -> tuple[int, str]:
    """(rank in the run order, work unit) of a test: the multi-process files first, as one unit;
    then each dry-run file; then every other file, a unit each."""
    path = nodeid.split("::", 1)[0]
    if path in DRY_RUN_FILES:
        return 1, path
    if path.startswith(PROCESS_TESTS_DIR):
        return 0, PROCESS_TESTS_DIR
    return 2, path


def pytest_collection_modifyitems(config, items):
    """Under xdist, collect in run order (xdist hands the units out in collection order)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _unit(item.nodeid)[0])  # stable: a file keeps its order


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own choice; optional without xdist
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n 2 --dist loadfile`` (the README's command): one work unit per test file, except
    that the multi-process files under tests/runtime/ are one unit, so they run one at a time on one
    worker (as without xdist: no two launches share the 2 cores) while the other worker starts on
    the dry-run files (single-threaded) and then the single-process files. A file's module-scoped
    fixtures are built once, on one worker. xdist's own ``--dist loadgroup`` would group by marks,
    but it renames node ids through an attribute pytest 9 no longer reads, so its groups are ignored."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ProcessTestsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)[1]

    config.option.loadscopereorder = False  # keep the run order above, not "most tests first"
    return ProcessTestsTogether(config, log)
