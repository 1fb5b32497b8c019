"""What every exporter returns, and the dispatch by target name."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from meshplan.plan import Recompute

if TYPE_CHECKING:
    from meshplan.plan import Job, Plan


class ExportTarget(str, enum.Enum):
    MEGATRON = "megatron"  # Megatron-LM pretrain_gpt.py command-line arguments
    MEGATRON_BRIDGE = "megatron-bridge"  # Megatron-Bridge recipe + dotted overrides
    TORCHTITAN = "torchtitan"  # torchtitan >= 0.3 command line, or job config TOML before it
    DEEPSPEED = "deepspeed"  # DeepSpeed config JSON


@dataclass(frozen=True)
class Export:
    """One exported config: its text and the approximations made (empty when exact)."""

    target: ExportTarget
    text: str
    warnings: tuple[str, ...] = ()


def export_job(job: "Job", target: ExportTarget | str, version: str | None = None) -> Export:
    """Export ``job`` to ``target`` (for the target's ``version`` where its form depends on it:
    torchtitan); raises MeshplanError for what the target cannot express."""
    from meshplan.export.deepspeed import export_deepspeed
    from meshplan.export.megatron import export_megatron
    from meshplan.export.megatron_bridge import export_megatron_bridge
    from meshplan.export.torchtitan_cli import export_torchtitan_for

    target = ExportTarget(target)
    if target == ExportTarget.TORCHTITAN:
        return export_torchtitan_for(job, version)
    fn = {ExportTarget.MEGATRON: export_megatron, ExportTarget.MEGATRON_BRIDGE: export_megatron_bridge,
          ExportTarget.DEEPSPEED: export_deepspeed}[target]
    return fn(job)


def uniform_recompute(plan: "Plan") -> tuple[bool, int]:
    """(all stages recompute every layer, the common per-stage count or -1 if they differ).

    ``plan`` must have its defaults filled (``Plan.with_defaults``).
    """
    if plan.recompute == Recompute.NONE:
        return False, 0
    every = all(r == n for r, n in zip(plan.recompute_layers, plan.stage_layers))
    counts = set(plan.recompute_layers)
    return every, counts.pop() if len(counts) == 1 else -1


def search_options_for(target: "ExportTarget | str") -> "SearchOptions":
    """The part of the search space a target can express at all, so that ``--best`` searches
    it instead of hoping the unrestricted frontier holds an expressible point. Conditional
    limits (DeepSpeed: ZeRO <= 1 with a pipeline) are still checked by the exporter itself."""
    from meshplan.plan import Recompute, Schedule
    from meshplan.search.space import SearchOptions

    if ExportTarget(target) == ExportTarget.DEEPSPEED:
        # DeepSpeed's pipeline engine runs 1F1B, has no virtual stages, no context parallel and
        # checkpoints whole layers (docs/interop.md).
        # Its pipeline engine takes ZeRO 0-1 only, AutoTP ZeRO 0-2, and no hybrid sharding
        # (the exporter's own rules).
        return SearchOptions(schedules=(Schedule.ONE_F_ONE_B,), max_vpp=1, max_cp=1,
                             recomputes=(Recompute.NONE, Recompute.FULL), allow=_deepspeed_runs)
    return SearchOptions()


def _deepspeed_runs(space) -> "object":
    # AutoTP has no sequence parallel, so sp plans would need more activation memory than planned;
    # hybrid sharding (replicas of shards) was ZeRO-3 MiCS, removed in DeepSpeed 0.19.
    hybrid = (space.dp_replicate > 1) & (space.dp_shard > 1)
    return (((space.pp == 1) | (space.zero <= 1)) & ((space.tp == 1) | (space.zero <= 2))
            & ~space.sp & ~hybrid)


def best_expressible(job: "Job", frontier: Sequence[object], target: "ExportTarget | str",
                     budget_gib: float, version: str | None = None) -> "tuple[int, Export] | None":
    """Fastest frontier point within the budget that ``target`` can express: (index, export).

    ``frontier`` holds the search's points (fastest first; each has ``plan`` and
    ``peak_memory_gib``); ``job`` supplies the model, batch and cluster they were searched for.
    """
    from dataclasses import replace

    from meshplan.errors import MeshplanError

    for i, point in enumerate(frontier):
        if point.peak_memory_gib > budget_gib:  # type: ignore[attr-defined]
            continue
        try:
            return i, export_job(replace(job, plan=point.plan), target, version)  # type: ignore[attr-defined]
        except MeshplanError:
            continue
    return None
