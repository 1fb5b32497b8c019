"""torchrun entry point: ``python -m meshplan.runtime.worker RUNS.json``.

RUNS.json is a list of runs, each {"job": <Job dict>, "config": <TrainConfig fields>}; they run one
after another in the same process group (tests batch several layouts into one launch this way).
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

from meshplan.errors import MeshplanError


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from meshplan.plan import Job
    from meshplan.runtime.train import TrainConfig, train

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # torch's notices that do not apply here: we slice flattened dims of the root mesh on purpose
    # (one mesh object for the whole plan), and no caller modifies the model's output in place.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    if len(argv) != 1:
        sys.stderr.write("usage: python -m meshplan.runtime.worker RUNS.json\n")
        return 2
    try:
        with open(argv[0]) as f:
            runs = json.load(f)
        for run in runs:
            train(Job.from_dict(run["job"]), TrainConfig(**run["config"]))
    except MeshplanError as exc:
        if not dist.is_initialized() or dist.get_rank() == 0:
            sys.stderr.write(f"error: {exc}\n")
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
