"""Worker entry point: ``python -m meshplan.runtime.worker RUNS.json`` (one process per rank).

RUNS.json is a list of runs, each {"job": <Job dict>, "config": <TrainConfig fields>}; they run one
after another in the same process group (tests batch several layouts into one launch this way).

A worker dies with its launcher, stops at a step boundary on SIGTERM/SIGUSR1, exits quietly on
Ctrl-C, and on an exception writes a one-line report and its traceback to the run directory (the
launcher prints the first one) instead of a traceback on the terminal; see runtime/lifecycle.py.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

from meshplan.errors import MeshplanError
from meshplan.launch_env import with_launcher_env
from meshplan.runtime.lifecycle import (
    EXIT_FAILED, EXIT_INTERRUPTED, RUN_DIR_ENV, RunStopped, StopRequests, die_with_parent,
    exit_quietly_on_interrupt, write_error_report,
)

EXIT_USER_ERROR = 2
"""A MeshplanError, as the CLI exits on one."""


def main(argv: list[str]) -> int:
    die_with_parent()
    exit_quietly_on_interrupt()
    import torch.distributed as dist

    if len(argv) != 1:
        sys.stderr.write("usage: python -m meshplan.runtime.worker RUNS.json\n")
        return EXIT_USER_ERROR
    run_dir = os.environ.get(RUN_DIR_ENV)
    stops = StopRequests(run_dir)
    stops.install()
    code = 0
    try:
        run_file(argv[0], stops)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001  every failure becomes a report, never a traceback here
        code = (exc.exit_code if isinstance(exc, RunStopped)
                else EXIT_USER_ERROR if isinstance(exc, MeshplanError) else EXIT_FAILED)
        _report(exc, run_dir, dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0")))
    finally:
        stops.uninstall()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code


def run_file(path: str, stops: StopRequests | None) -> None:
    """Train every run of a RUNS.json file in this process (exceptions propagate)."""
    from meshplan.plan import Job
    from meshplan.runtime.train import train
    from meshplan.runtime.train_config import TrainConfig

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # torch's notices that do not apply here: we slice flattened dims of the root mesh on purpose
    # (one mesh object for the whole plan), and no caller modifies the model's output in place.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    with open(path) as f:
        runs = json.load(f)
    for run in runs:
        train(Job.from_dict(run["job"]), TrainConfig(**run["config"]), stops=stops)


def run_in_place(path: str) -> None:
    """Under an external torchrun: this process is a rank; it dies with torchrun's agent, and
    errors, stop requests and Ctrl-C propagate to the CLI (one line, its exit code). The
    launcher's allocator settings (meshplan/launch_env.py) go into this process's environment
    first, where torchrun's caller set none: the allocator reads them when CUDA initialises, which
    the run's device set-up does later."""
    os.environ.update(with_launcher_env(os.environ))
    import torch.distributed as dist

    die_with_parent()
    stops = StopRequests(None)
    stops.install()
    try:
        run_file(path, stops)
    finally:
        stops.uninstall()
    if dist.is_initialized():
        dist.destroy_process_group()


def _report(exc: BaseException, run_dir: str | None, rank: int) -> None:
    """The report file for the launcher; without one (started by hand), one line on stderr."""
    if run_dir:
        write_error_report(run_dir, rank, exc)
    else:
        sys.stderr.write(f"error: rank {rank}: {type(exc).__name__}: {exc}\n")


if __name__ == "__main__":
    exit_code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # After a failure skip interpreter teardown: a process group whose peer is gone can block it.
    os._exit(exit_code)
