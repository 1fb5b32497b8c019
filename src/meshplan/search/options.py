"""What the search may vary (:class:`SearchOptions`) and the integer codes of the space's enum
columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshplan.cost.arrays import CP_METHOD_CODES, RECOMPUTE_CODES, SCHEDULE_CODES, PlanArrays
from meshplan.plan import CPMethod, Offload, Recompute, RecomputeModule, Schedule

# The integer codes of the enum columns: the cost model's (one table, cost.arrays).
SCHEDULES: tuple[Schedule, ...] = SCHEDULE_CODES
RECOMPUTES: tuple[Recompute, ...] = RECOMPUTE_CODES
CP_METHODS: tuple[CPMethod, ...] = CP_METHOD_CODES

OFFLOAD_CHOICES: tuple[tuple[Offload, ...], ...] = (
    (Offload.OPTIMIZER,), (Offload.ACTIVATIONS,), (Offload.OPTIMIZER, Offload.ACTIVATIONS),
    (Offload.OPTIMIZER, Offload.PARAMS), (Offload.OPTIMIZER, Offload.PARAMS, Offload.ACTIVATIONS))
"""Every legal non-empty offload combination (``params`` goes with ``optimizer``: Plan's rule)."""

MAX_VPP = 8
"""Virtual stages per pipeline rank searched with any layer split. Beyond it (published
Megatron-Core recipes use 10 to 24 chunks per rank) only chunk counts that split the layers
evenly are searched, the layers alone or with the embedding and the loss counted as one layer
each: Megatron needs ``num_layers`` (or ``num_layers + 2`` with
``--account-for-embedding/loss-in-pipeline-split``) divisible by ``pp * vpp`` without a custom
layout (Qwen3-235B's 94 layers: pp 4 x vpp 12). This bounds the space (it is not a dominance
rule)."""


@dataclass(frozen=True)
class SearchOptions:
    """What the search may vary; defaults search everything the cost model can estimate."""

    schedules: tuple[Schedule, ...] = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)
    recomputes: tuple[Recompute, ...] = RECOMPUTES
    cp_methods: tuple[CPMethod, ...] = CP_METHODS
    max_vpp: int | None = None
    """Largest vpp searched; None: as many as the layer count allows (``MAX_VPP`` with any
    split, beyond it even splits only)."""
    nonuniform_stages: bool = True
    """Search per-stage layer counts and recomputed-layer counts (else even split, all layers)."""
    max_cp: int | None = None
    """Largest context-parallel degree (None: any); 1 for a target without context parallel."""
    offloads: tuple[tuple[Offload, ...], ...] = OFFLOAD_CHOICES
    """Offload choices tried on the configurations memory holds back (``meshplan.search.offload``);
    empty: no offload. Tried only on clusters that describe their host side."""
    offload_layer_counts: bool = False
    """Offload the activations of a searched count of layers, 1 to ``num_layers - 1`` (Megatron-Core's
    ``cpu_offloading_num_layers``, ``meshplan.search.offload``) instead of every layer's; False:
    every layer's (meshplan's runtime: its ``save_on_cpu`` hooks take every layer)."""
    vocab_parallel: bool = True
    """Try vocabulary parallelism over the pipeline ranks (``meshplan.search.vocab``)."""
    osdp: bool = True
    """Try OSDP's groups kept gathered and operator splits on zero-3 configurations
    (``meshplan.search.osdp``)."""
    expert_placement: bool = True
    """Try balanced expert placement and hot-expert replicas when the training describes its
    expert load (``meshplan.search.expert_load``)."""
    recompute_module_sets: tuple[tuple[RecomputeModule, ...], ...] = ()
    """Beyond the default (the attention core), the module sets selective recompute is also
    tried with on MoE models (Megatron-Core's ``--recompute-modules``); sets naming a module the
    model lacks are skipped. Empty: the default only."""
    embedding_loss_chunks: bool = False
    """Also search interleaved plans of ``num_layers + 2`` virtual stages, the embedding and the
    loss each a virtual stage of its own (Megatron-Core's
    ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``,
    ``TransformerConfig.account_for_*_in_pipeline_split``: the embedding and the loss count as one
    layer each and the ``num_layers + 2`` slots split evenly over ``pp * vpp``; the Llama 3.1 405B
    Megatron-Bridge recipe, pp16 x vpp8 for 126 layers, scripts/performance/configs/llama/
    llama31_workload_base_configs.py@0013c9a). Such a layout has one split (``plan.embedding_loss_split``):
    :mod:`meshplan.search.embedding_chunks` scores it exactly. On for the targets that run stages
    holding no transformer layer: Megatron, torchtitan (its default split gives them with L + 2
    stages: ``export.common.search_options_for``) and meshplan's runtime (its pipeline cuts such a
    stage as any other: tests/runtime/test_pipeline_embedding_chunks.py checks loss parity); off by
    default (``search()`` without a target) and for DeepSpeed (no interleaving)."""
    allow: "Callable[[PlanArrays], np.ndarray] | None" = None
    """A caller's vectorised restriction (True = keep), e.g. what an export target can run;
    not a pruning rule: the frontier is then the restricted space's frontier."""
    allow_split: "Callable[[PlanArrays, np.ndarray, np.ndarray], np.ndarray] | None" = None
    """The same for uneven splits: given the configurations (one row per point) and each point's
    per-rank layer and recomputed counts (P, pp), True = keep; e.g. a stack that recomputes
    every layer of a stage or none (Megatron's selective recompute, torchtitan's)."""
