"""A ``Job``: a plan with the model, training and cluster it is for; the versioned JSON file that
``meshplan plan --out`` writes and ``meshplan train --plan`` reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.errors import MeshplanError
from meshplan.plan.core import PLAN_FORMAT_VERSION, READABLE_PLAN_VERSIONS, Plan

if TYPE_CHECKING:
    from meshplan.spec.cluster import ClusterSpec
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec

_SECTIONS = ("model", "training", "cluster", "plan")
"""The sections of a plan file, beside its ``meshplan_plan_version``."""
TARGET_STACKS = ("meshplan", "megatron", "torchtitan", "deepspeed")
"""The stacks a plan file's ``target`` may name: the values of ``meshplan.targets.Target``, which
this layer cannot import (tests/planner/test_targets.py keeps the two equal). A file naming
another is refused when read, not by whichever command first estimates it (export and
``train --dry-run`` never did)."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """What to train, on what, and how: the versioned JSON file the runtime consumes."""

    model: "ModelSpec"
    training: "TrainingSpec"
    cluster: "ClusterSpec"
    plan: Plan
    target: str | None = None
    """The stack the plan was made for (``meshplan plan --target``: megatron, torchtitan, deepspeed),
    whose calibration ``estimate``, ``explain``, ``report`` and ``plan --compare`` then use for it
    by default, so that every command gives the step time the search chose it on; None: meshplan's
    own runtime. Written only when set: a plan for meshplan's runtime is the file it always was."""
    version: int = PLAN_FORMAT_VERSION

    def __post_init__(self) -> None:
        self.plan.validate_for(self.model, self.training, self.cluster.num_gpus)

    @cached_property
    def full_plan(self) -> Plan:
        """The plan with its layer split and recomputed layers filled for this model
        (:meth:`Plan.with_defaults`): what every reader of a job (runtime, exporters, dry-run
        reports) works on. A ``Plan`` cannot be complete when built, as its even split needs the
        model's layer count; a Job is the first place that knows both, so it fills them, once.
        ``plan`` stays as given: the file a job writes, and the plan callers derive others from
        (``replace(job.plan, dims=...)`` must not carry a split made for other degrees)."""
        return self.plan.with_defaults(self.model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "meshplan_plan_version": self.version,
            "model": self.model.to_dict(),
            "training": self.training.to_dict(),
            "cluster": self.cluster.to_dict(),
            "plan": self.plan.to_dict(),
            **({"target": self.target} if self.target is not None else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Job":
        from meshplan.spec.cluster import ClusterSpec
        from meshplan.spec.model import ModelSpec
        from meshplan.spec.training import TrainingSpec

        if not isinstance(data, dict) or "meshplan_plan_version" not in data:
            raise MeshplanError("not a meshplan plan file (no 'meshplan_plan_version' field)")
        version = data["meshplan_plan_version"]
        if isinstance(version, bool) or version not in READABLE_PLAN_VERSIONS:
            raise MeshplanError(
                f"plan file version {version!r} is not supported (this meshplan reads "
                f"{', '.join(map(str, READABLE_PLAN_VERSIONS))})"
            )
        unknown = sorted(set(data) - {"meshplan_plan_version", "target", *_SECTIONS})
        if unknown:
            raise MeshplanError(f"unknown plan file field(s): {', '.join(map(str, unknown))} (a plan file holds "
                                f"meshplan_plan_version, {', '.join(_SECTIONS)} and an optional target)")
        for key in _SECTIONS:
            if key not in data:
                raise MeshplanError(f"plan file has no '{key}' section")
            if not isinstance(data[key], dict):
                raise MeshplanError(f"plan file's '{key}' section must be an object, got {data[key]!r}")
        target = data.get("target")
        if target is not None and (not isinstance(target, str) or not target.strip()):
            raise MeshplanError(f"plan file's 'target' must name a stack (megatron, torchtitan, ...), got {target!r}")
        if target is not None and target not in TARGET_STACKS:
            raise MeshplanError(f"plan file's target {target!r} is not one of {', '.join(TARGET_STACKS)}")
        return cls(
            target=target,
            model=ModelSpec.from_dict(data["model"]),
            training=TrainingSpec.from_dict(data["training"]),
            cluster=ClusterSpec.from_dict(data["cluster"]),
            plan=Plan.from_dict(data["plan"]),
        )

    @classmethod
    def load(cls, path: str | Path) -> "Job":
        from meshplan.jsonfile import load_json_file

        return load_json_file(path, cls.from_dict, missing="no such plan file", what="plan file (JSON)")
