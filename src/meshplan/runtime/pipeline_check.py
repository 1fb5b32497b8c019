"""Pipeline-parallel checks that need no torch: which layers go where, and what the runtime refuses.

The runtime calls :func:`check_pipeline_plan` before any process group starts, so a pipeline plan
it cannot run fails with one clear line instead of a hang or a traceback inside torch's schedules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.plan import Plan, Recompute, Schedule, even_split

if TYPE_CHECKING:
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec


ZERO_BUBBLE_RECOMPUTE = (
    "zero-bubble with recompute is not supported: its split backward (input grads, then weight "
    "grads) recomputes each checkpointed layer twice, which torch's composable checkpoint used by "
    "this runtime cannot do (torch 2.13); use interleaved-1f1b or recompute 'none'"
)


def stage_layer_keys(plan: Plan, num_layers: int) -> list[list[str]]:
    """Layer keys ("0".."L-1", the ``layers`` ModuleDict's keys) of every virtual stage, in model order.

    Follows ``plan.stage_layers`` (an even split when it is empty); virtual stage ``i`` then runs on
    pipeline rank ``i % pp`` (``Plan.stage_rank``).
    """
    counts = plan.stage_layers or even_split(num_layers, plan.num_stages)
    if len(counts) != plan.num_stages:
        raise MeshplanError(f"stage_layers has {len(counts)} entries; pp*vpp={plan.num_stages} stages")
    if sum(counts) != num_layers:
        raise MeshplanError(f"stage_layers sum to {sum(counts)}, the model has {num_layers} layers")
    if 0 in counts:
        raise MeshplanError(f"stage_layers {list(counts)}: a stage holding only the embedding or the loss "
                            "is not supported by this runtime; give every stage a layer")
    keys: list[list[str]] = []
    start = 0
    for n in counts:
        keys.append([str(i) for i in range(start, start + n)])
        start += n
    return keys


def local_stage_indices(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages held by pipeline rank ``pp_rank`` (looped placement, Narayanan et al. 2021)."""
    return [s for s in range(plan.num_stages) if plan.stage_rank(s) == pp_rank]


def check_pipeline_plan(model: "ModelSpec", training: "TrainingSpec", plan: Plan) -> None:
    """Raise MeshplanError if torch.distributed.pipelining cannot run this pipeline plan as given.

    Does nothing when ``pp == 1``. The limits come from torch's schedule classes (torch 2.6-2.13):
    1F1B needs at least as many micro-batches as stages; the multi-stage schedules (interleaved 1F1B,
    zero bubble) group micro-batches in rounds of ``pp`` and need ``n_microbatches`` to be a
    multiple of the number of rounds ``max(1, n_microbatches // pp)``. Zero bubble is refused with
    activation recompute (see ``ZERO_BUBBLE_RECOMPUTE``).
    """
    pp = plan.dims.pp
    if pp == 1:
        return
    stage_layer_keys(plan, model.num_layers)  # split must cover the model exactly
    n_mb = plan.num_microbatches(training)
    if plan.schedule == Schedule.ONE_F_ONE_B and n_mb < pp:
        raise MeshplanError(
            f"1F1B with pp={pp} needs at least {pp} micro-batches per step, the plan has {n_mb} "
            "(global_batch / (dp * micro_batch)); use gpipe or a smaller micro_batch"
        )
    if plan.schedule == Schedule.ZERO_BUBBLE and plan.recompute != Recompute.NONE and any(
        plan.with_defaults(model).recompute_layers
    ):
        raise MeshplanError(ZERO_BUBBLE_RECOMPUTE)
    if plan.schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE):
        rounds = max(1, n_mb // pp)
        if n_mb % rounds:
            raise MeshplanError(
                f"{plan.schedule.value} with pp={pp} needs the {n_mb} micro-batches per step to be a "
                f"multiple of the number of rounds max(1, n_microbatches // pp) = {rounds}"
            )
