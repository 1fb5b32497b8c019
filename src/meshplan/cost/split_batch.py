"""Many plans with their own layer splits at once: what :func:`meshplan.cost.estimate` gives each,
as arrays, for the calibration fit (calib/fit.py) to score rows that ran an uneven split.

:func:`meshplan.cost.batch.estimate_batch` assumes the even split (the first and last ranks are
then the candidates for the slowest and the most loaded). A row that ran a Megatron layout
(``Plan.stage_layers``, ``Plan.mtp_stage``: DeepSeek-V3 on pp16 runs ``4 x 15, 1`` with its MTP
module on the last rank) is paced by another rank; fitted as if even, the calibration would absorb
the even split's heavier last rank. Here every rank of every plan is costed with its own layers,
recomputed layers, offloaded layers and MTP modules, as ``estimate`` does, and composed the same
way (:func:`meshplan.cost.step_compose.compose`).
"""

from __future__ import annotations

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import BatchEstimate, compose, rank_cost
from meshplan.cost.calibration import Calibration
from meshplan.cost.chunk_inflight import largest_chunk_layers, plan_chunk_weight
from meshplan.cost.layer import layer_cost
from meshplan.cost.plan_terms import num_microbatches, plan_terms
from meshplan.cost.rank_layers import lead_on_rank, needs_rank_mix, stack_layers
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def estimate_split_batch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                         plans: list[Plan], calib: Calibration) -> BatchEstimate:
    """Step time and peak memory (reserved and allocated) of ``plans``, each with its own split;
    the plans share ``pp`` (one rank_cost call per rank over all of them)."""
    filled = [p.with_defaults(model) for p in plans]
    pps = {p.dims.pp for p in filled}
    if len(pps) != 1:
        raise MeshplanError(f"estimate_split_batch scores plans of one pp at a time, got pp {sorted(pps)}")
    pp = pps.pop()
    arrays = PlanArrays.from_plans(filled)
    layer = layer_cost(model, cluster, training, arrays, calib)
    kw = dict(model=model, cluster=cluster, training=training, plans=arrays, calib=calib, layer=layer)
    kw["terms"] = plan_terms(**kw)
    if needs_rank_mix(model):  # each rank charged the kinds it holds (cost/rank_layers.py)
        kw["stack"] = stack_layers(model, cluster, training, arrays, calib)
    counted = any(p.offload_layers for p in filled)
    m = np.broadcast_to(num_microbatches(training, arrays), (len(filled),))
    ranks = []
    for r in range(pp):
        layers = np.array([p.layers_on_rank(r) for p in filled], dtype=float)
        recomputed = np.array([p.recomputed_on_rank(r) for p in filled], dtype=float)
        # as estimate(): the plan's count where it has one, else every layer of the rank
        offloaded = np.array([p.layers_on_rank(r) if p.offloaded_on_rank(r) is None else p.offloaded_on_rank(r)
                              for p in filled], dtype=float) if counted else None
        ranks.append(rank_cost(**kw, rank=r, layers=layers, recomputed=recomputed, has_embedding=r == 0,
                               has_head=r == pp - 1, has_mtp=np.array([p.mtp_rank == r for p in filled]),
                               offloaded_layers=offloaded,
                               chunk_weight=np.array([plan_chunk_weight(p, r, int(mi)) for p, mi in zip(filled, m)]),
                               lead=np.array([lead_on_rank(model, p.stage_layers, pp, r) for p in filled]),
                               chunk_layers=np.array([largest_chunk_layers(p, r) for p in filled], dtype=float)))
    return compose(model, cluster, training, arrays, ranks, calib, allocated=True)
