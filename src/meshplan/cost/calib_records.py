"""The calibration data file (``FITTED_FILE`` under meshplan.spec): the fitted records per
(GPU generation, stack), each stack's mechanisms, the GPU families' generations and which records
lend their hardware fields. Loading and shape only: checking the values against
:class:`~meshplan.cost.calibration.Calibration` is ``calibration.fitted_records`` /
``calibration.stack_records``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping

from meshplan.fsdp_policy import RUNTIME_SOURCE, runtime_values
from meshplan.ring_policy import RUNTIME_SOURCE as RING_SOURCE
from meshplan.ring_policy import runtime_values as ring_values
from meshplan.launch_env import LAUNCHER_SOURCE, launcher_env, sets_expandable_segments
from meshplan.shipped import shipped_json
from meshplan.spec.cluster import GPUSpec

FITTED_FILE = "presets/calibration_fitted.json"
"""The calibration per (GPU generation, stack) as data with its sources (under meshplan.spec)."""

DEFAULT_STACK = "meshplan"
"""The stack an estimate is for when none is named: meshplan's own runtime (`meshplan train`)."""


@dataclass(frozen=True, kw_only=True)
class FittedRecord:
    """The fitted Calibration fields of one (generation, stack) and where they come from."""

    key: str
    """'generation/stack', e.g. 'hopper/megatron'."""
    source: str
    how: str
    values: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class StackRecord:
    """How one training stack runs a plan: its overlap and host-cost fields, with the source."""

    stack: str
    source: str
    values: Mapping[str, Any]


def record_key(generation: str, stack: str) -> str:
    return f"{generation}/{stack}"


@lru_cache(maxsize=1)
def calibration_file() -> Mapping[str, Any]:
    """``FITTED_FILE`` as parsed JSON (read once)."""
    return shipped_json("meshplan.spec", FITTED_FILE)


def read_fitted_records() -> dict[str, FittedRecord]:
    """The file's 'records', by 'generation/stack'."""
    return {key: FittedRecord(key=key, source=rec["source"], how=rec["how"],
                              values=MappingProxyType(dict(rec["values"])))
            for key, rec in calibration_file()["records"].items()}


def read_stack_records() -> dict[str, StackRecord]:
    """The file's 'stacks', by stack name; meshplan's own stack with its launcher's allocator
    setting (:func:`launcher_values`), its runtime's FSDP2 buffers (fsdp_policy.runtime_values)
    and its ring attention's score tiles (ring_policy.runtime_values)."""
    records = {}
    for stack, rec in calibration_file()["stacks"].items():
        values, source = dict(rec["values"]), rec["source"]
        if stack == DEFAULT_STACK:
            values.update(launcher_values())
            values.update(runtime_values())
            values.update(ring_values())
            source = f"{source}; {LAUNCHER_SOURCE}; {RUNTIME_SOURCE}; {RING_SOURCE}"
        records[stack] = StackRecord(stack=stack, source=source, values=MappingProxyType(values))
    return records


def launcher_values() -> dict[str, Any]:
    """The Calibration fields meshplan's launcher sets for its own runs (meshplan/launch_env.py):
    read from the environment it gives the ranks, not written down a second time."""
    return {"allocator_expandable_segments": sets_expandable_segments(launcher_env())}


def lender_keys() -> tuple[str, ...]:
    """Record keys whose hardware fields a (generation, stack) without a record of its own
    borrows, the first of its generation in this order."""
    return tuple(calibration_file()["lenders"])


def gpu_family(gpu: GPUSpec) -> str:
    """'a100', 'v100', 'h100', ... : the part of the name before the first '-'."""
    return gpu.name.split("-")[0].lower()


def gpu_generation(gpu: GPUSpec) -> str:
    """'volta', 'ampere', 'hopper', 'blackwell', 'cpu', ...: the family's generation (data);
    a family the file does not list is its own generation."""
    family = gpu_family(gpu)
    return calibration_file()["generations"].get(family, family)
