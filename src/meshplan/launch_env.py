"""The environment meshplan's own launcher gives every rank, and that its exports print.

One fact, read by three sides: the runtime's launcher (``runtime/launch.py``, and a worker started
under an outside torchrun), the exported launch lines (Megatron-LM, Megatron-Bridge, torchtitan's
command line), and the memory model's meshplan stack (``cost/calib_records.py``), whose
``allocator_expandable_segments`` is what this launcher sets, so "fits" holds what runs.

``expandable_segments:True``: the caching allocator maps its segments in 2 MiB pages and unmaps
the free ones before it reports out of memory (PyTorch docs, 'CUDA semantics: Optimizing memory
usage with PYTORCH_CUDA_ALLOC_CONF'; c10/cuda/CUDACachingAllocator.cpp ``release_blocks`` ->
``unmap_block``, pytorch/pytorch PR #96995), so the allocator's reserve is given back under
pressure (Calibration.allocator_expandable_segments). torchtitan's run_train.sh sets it for every
run; Megatron-Bridge's performance launcher for the runs it names "OOM if not set".
Pure Python, no torch import.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
"""The caching allocator's settings. torch >= 2.9 also reads ``PYTORCH_ALLOC_CONF`` and keeps
this name as its CUDA alias, so one name serves every torch a launched job may run."""
EXPANDABLE_SEGMENTS = "expandable_segments:True"
"""The setting meshplan's launcher gives every rank."""


def launcher_env() -> dict[str, str]:
    """The variables meshplan's launcher sets for every rank (a user's own value is kept)."""
    return {ALLOC_CONF_ENV: EXPANDABLE_SEGMENTS}


def env_assignments() -> str:
    """``NAME=value`` words for a printed launch line."""
    return " ".join(f"{k}={v}" for k, v in launcher_env().items())


def with_launcher_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the launcher's variables added where the caller did not set them."""
    out = dict(env)
    for key, value in launcher_env().items():
        out.setdefault(key, value)
    return out


def sets_expandable_segments(env: Mapping[str, str]) -> bool:
    """Whether an environment's allocator settings turn expandable segments on (the last
    ``expandable_segments`` option of the comma-separated list wins, as torch parses it)."""
    on = False
    for option in env.get(ALLOC_CONF_ENV, "").split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip() == "True"
    return on


LAUNCHER_SOURCE = (f"meshplan's own launcher sets {ALLOC_CONF_ENV}={EXPANDABLE_SEGMENTS} for every rank "
                   "(meshplan/launch_env.py, read by runtime/launch.py and the exported launch lines)")
"""What the meshplan stack record's ``allocator_expandable_segments`` comes from."""
