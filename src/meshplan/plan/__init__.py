"""The one contract between planner and runtime.

A ``Plan`` says *how* to parallelise: the degree of every device-mesh axis and every other choice
(ZeRO stage, sequence parallel, pipeline schedule and layer split, micro-batch, recompute).
A ``Job`` bundles a plan with *what* is trained (``ModelSpec``, ``TrainingSpec``) and *where*
(``ClusterSpec``); it is the versioned JSON file that ``meshplan plan --out`` writes and
``meshplan train --plan`` reads. The runtime executes a Job and never re-decides it.

Mesh layout (outermost to innermost, as in torchtitan): ``pp, dp_replicate, dp_shard, cp, tp``.
Ranks are laid out so that ``tp`` is contiguous (inside a node first), then ``cp``, ``dp_shard``,
``dp_replicate`` and ``pp``: ``rank = (((pp*R + r)*S + s)*C + c)*T + t``.
Expert parallel (``ep``) does not add ranks: it reuses the ``dp_shard x cp`` ranks
(torchtitan's convention), so ``ep`` must divide ``dp_shard * cp``.

Virtual pipeline stages: with ``pp`` ranks and ``vpp`` stages per rank there are ``pp * vpp``
stages in model order; stage ``i`` runs on pipeline rank ``i % pp`` (the interleaved/looped
placement of Narayanan et al. 2021, Sec. 2.2.2).
"""


# The package's one public face: callers import every name below from ``meshplan.plan``.
from meshplan.plan.choices import (  # noqa: F401
    MESH_AXIS_ORDER, OFFLOAD_ACTIVATIONS_BIT, OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT, CPMethod,
    ExpertPlacement, MeshAxis, Offload, OpGroup, Recompute, RecomputeModule, Schedule, group_choices, group_code,
    offload_choices, offload_code, recompute_module_choices, recompute_module_code,
)
from meshplan.plan.checks import check_model_takes, check_plan_fits, missing_module  # noqa: F401
from meshplan.plan.core import PLAN_FORMAT_VERSION, READABLE_PLAN_VERSIONS, Plan  # noqa: F401
from meshplan.plan.dims import ParallelDims, data_parallel_degree  # noqa: F401
from meshplan.plan.job import Job  # noqa: F401
from meshplan.plan.notation import plan_notation  # noqa: F401
from meshplan.plan.layout import PipelineLayout, format_layout, looks_like_layout, parse_layout  # noqa: F401
from meshplan.plan.split import (  # noqa: F401
    embedding_loss_split, even_split, format_counts, parse_counts, torchtitan_split, torchtitan_split_2024,
)
