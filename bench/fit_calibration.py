"""Refit the calibration per (GPU generation, stack) on the shipped published runs and rewrite
the fitted records of spec/presets/calibration_fitted.json (the stacks' mechanisms and the
records of pairs without runs are kept). Re-run it after merging a branch that adds a cost
mechanism, then bench/bench_validate.py to see the scores.

    PYTHONPATH=src python bench/fit_calibration.py                   # both shipped sets
    PYTHONPATH=src python bench/fit_calibration.py megatron-bridge   # one
    PYTHONPATH=src python bench/fit_calibration.py --workers 3       # records fitted 3 at a time

It is the CLI command, run once per set: meshplan validate --runs SET --fit --write-calibration
--out src/meshplan/spec/presets/calibration_fitted.json --force (the shipped file, named and forced).
"""

from __future__ import annotations

import subprocess
import sys

from meshplan.calib.records import fitted_file
from meshplan.data.published import PUBLISHED_RUNS

SETS = tuple(PUBLISHED_RUNS)


def main(argv: list[str]) -> int:
    workers = "1"
    if "--workers" in argv:
        i = argv.index("--workers")
        workers, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    for name in argv or SETS:
        cmd = [sys.executable, "-m", "meshplan", "validate", "--runs", name, "--fit", "--write-calibration",
               "--out", str(fitted_file()), "--force", "--workers", workers]
        rc = subprocess.run(cmd, check=False).returncode
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
