"""Pipeline-parallel checks that need no torch: which layers go where, and what the runtime refuses.

The runtime calls :func:`check_pipeline_plan` before any process group starts, so a pipeline plan
it cannot run fails with one clear line instead of a hang or a traceback inside torch's schedules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.plan import Plan, even_split
from meshplan.targets import ZERO_BUBBLE_RECOMPUTE, Target, check_runs  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec


def stage_layer_ranges(plan: Plan, num_layers: int) -> list[range]:
    """Layer indices of every virtual stage, in model order, as ranges (a stack of 10^8 layers
    costs what one of 10 does: nothing is listed layer by layer).

    Follows ``plan.stage_layers`` (an even split when it is empty); virtual stage ``i`` then runs on
    pipeline rank ``i % pp`` (``Plan.stage_rank``). The first and the last stage may hold no layer
    (the embedding or the loss alone, Megatron's ``--account-for-embedding/loss-in-pipeline-split``):
    ``cut_stage`` keeps their embedding / norm and head, an empty ``layers`` dict runs as the identity.
    """
    counts = plan.stage_layers or even_split(num_layers, plan.num_stages)
    if len(counts) != plan.num_stages:
        raise MeshplanError(f"stage_layers has {len(counts)} entries; pp*vpp={plan.num_stages} stages")
    if sum(counts) != num_layers:
        raise MeshplanError(f"stage_layers sum to {sum(counts)}, the model has {num_layers} layers")
    ranges: list[range] = []
    start = 0
    for n in counts:
        ranges.append(range(start, start + n))
        start += n
    return ranges


def stage_layer_keys(plan: Plan, num_layers: int) -> list[list[str]]:
    """Layer keys ("0".."L-1", the ``layers`` ModuleDict's keys) of every virtual stage, in model
    order (:func:`stage_layer_ranges` spelled out: for the runtime, which builds those modules)."""
    return [[str(i) for i in r] for r in stage_layer_ranges(plan, num_layers)]


def local_stage_indices(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages held by pipeline rank ``pp_rank`` (looped placement, Narayanan et al. 2021)."""
    return [s for s in range(plan.num_stages) if plan.stage_rank(s) == pp_rank]


def check_pipeline_plan(model: "ModelSpec", training: "TrainingSpec", plan: Plan) -> None:
    """Raise MeshplanError if torch.distributed.pipelining cannot run this pipeline plan as given.

    Does nothing when ``pp == 1``. The split must cover the model exactly; the schedules' own
    limits (micro-batch counts, zero bubble without recompute) are rules of the meshplan target
    (``meshplan.targets``), the same rules the search applies.
    """
    if plan.dims.pp == 1:
        return
    stage_layer_ranges(plan, model.num_layers)  # split must cover the model exactly
    check_runs(Target.MESHPLAN, model, training, plan)
