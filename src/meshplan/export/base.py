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


def refuse_moe_routing(job, stack: str, *, dispatchers: tuple[str, ...], drops_tokens: bool) -> None:
    """One line when an MoE plan's dispatcher (``TrainingSpec.moe_dispatcher``) is not among those
    ``stack`` runs, or its capacity factor asks for dropped tokens that ``stack`` cannot drop."""
    if not job.model.is_moe:
        return
    t = job.training
    if t.moe_dispatcher.value not in dispatchers:
        raise MeshplanError(f"{stack} dispatches MoE tokens by {' or '.join(dispatchers)}, not "
                            f"{t.moe_dispatcher.value}: plan with --moe-dispatcher {dispatchers[0]}, "
                            "or export to megatron")
    if t.moe_capacity_factor is not None and not drops_tokens:
        raise MeshplanError(f"{stack}'s MoE is dropless (no expert capacity): the plan drops tokens beyond "
                            f"capacity {t.moe_capacity_factor:g}; plan dropless (no --moe-capacity-factor), "
                            "or export to megatron")


def refuse_data_schedule(job, stack: str) -> None:
    """One line when the plan's training runs ByteScale's per-bucket context parallel or balances
    documents over the data-parallel ranks (``TrainingSpec.cp_buckets``, ``doc_balance``): the
    meshplan runtime's data loader does both, and no exported stack's config has either."""
    t = job.training
    if t.cp_buckets:
        raise MeshplanError(f"{stack} has no per-bucket context parallel (--cp-buckets): plan with --no-cp-buckets")
    if t.doc_balance.value != "stream":
        raise MeshplanError(f"{stack} feeds documents in data order: plan with --doc-balance stream, not "
                            f"{t.doc_balance.value}")
