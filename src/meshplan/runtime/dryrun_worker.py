"""One simulated rank: ``python -m meshplan.runtime.dryrun_worker JOB.json RANK STEPS OUT.json``."""

from __future__ import annotations

import json
import logging
import sys
import warnings

from meshplan.errors import MeshplanError


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write("usage: python -m meshplan.runtime.dryrun_worker JOB.json RANK STEPS OUT.json\n")
        return 2
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    # Notices that do not apply to a dry run (see runtime/worker.py for the first two).
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    from meshplan.plan import Job
    from meshplan.runtime.dryrun import simulate_rank

    job_path, rank, steps, out = argv[0], int(argv[1]), int(argv[2]), argv[3]
    try:
        result = simulate_rank(Job.load(job_path), rank, steps=steps)
    except MeshplanError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    with open(out, "w") as f:
        json.dump(result.to_dict(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
