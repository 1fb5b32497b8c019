"""What every exporter returns, and what they share (imported by the exporters and by
``export.common``'s dispatch; it imports neither)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.plan import ExpertPlacement, Recompute

if TYPE_CHECKING:
    from meshplan.plan import Plan


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


def uniform_recompute(plan: "Plan") -> tuple[bool, int]:
    """(all stages recompute every layer, the common per-stage count or -1 if they differ).

    ``plan`` must have its defaults filled (``Job.full_plan``, ``Plan.with_defaults``).
    """
    if plan.recompute == Recompute.NONE:
        return False, 0
    every = all(r == n for r, n in zip(plan.recompute_layers, plan.stage_layers))
    counts = set(plan.recompute_layers)
    return every, counts.pop() if len(counts) == 1 else -1


def refuse_expert_placement(plan, stack: str) -> None:
    """One line when ``plan`` places experts other than contiguously: no exported stack can."""
    if plan.expert_placement != ExpertPlacement.CONTIGUOUS or plan.expert_replicas:
        raise MeshplanError(f"{stack} places experts contiguously (ids r*E/ep.. on ep rank r) and has no expert "
                            "replicas; plan with --expert-placement contiguous --expert-replicas 0")


def refuse_recompute_modules(plan, stack: str) -> None:
    """One line naming the first of Megatron-Core's recompute modules (``Plan.recompute_modules``)
    that ``stack`` has no counterpart for (it checkpoints whole blocks or ops, not named modules)."""
    if plan.recompute_modules:
        raise MeshplanError(f"{stack} cannot recompute module {plan.recompute_modules[0].value!r} (Megatron-Core's "
                            "--recompute-modules): plan selective recompute without --recompute-modules, "
                            "or full, or export to megatron")
