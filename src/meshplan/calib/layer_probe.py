"""The layer probe: what `meshplan profile` runs to measure the runtime's own per-layer overhead.

A layer too small for its math or bytes to count (D=32, 8 tokens a rank) is trained forward +
backward through meshplan's runtime (its model, its ``parallelize``, its loss) with 1 and with 5
layers under each parallelism over 2 processes. The time per extra layer is what one layer costs
on that path; the part the cost model's formulas do not predict (alpha-beta collectives with the
profile's per-op rates, math, memory-bound ops, the single-process dispatch
``layer_overhead_s``) is what the runtime's path adds per layer: DTensor / FSDP2 dispatch, the
wrapping and copies around each collective, the wake-up of the rank that waited
(``Calibration.<kind>_layer_overhead_s``, fitted in ``meshplan.calib.hwcalib``). Both sides build their jobs here, so they measure and predict the same
thing. Pure Python: the planner reads profiles without torch.
"""

from __future__ import annotations

import enum

from meshplan.plan import CPMethod, Job, ParallelDims, Plan
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

PROBE_MODEL = "toy-llama"


PROBE_OVERRIDES = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 2, "ffn_hidden_size": 64,
                   "vocab_size": 64}
PROBE_SEQ_LEN = 8
"""Tokens of one row; each data-parallel rank gets one row (one micro-batch)."""
PROBE_LAYERS = (1, 5)
ELEMENTWISE_PROBE = {"hidden_size": 512, "num_heads": 8, "num_kv_heads": 4, "ffn_hidden_size": 1536}
"""Layer shape of the elementwise probe: the runtime's norms, residual adds, SwiGLU, rotary
embedding and GQA K/V repeat, forward + backward, without the matmuls, on ELEMENTWISE_TOKENS."""
ELEMENTWISE_TOKENS = 2048
PROBE_GROUP_SIZE = 2


class ProbeKind(str, enum.Enum):
    """One parallelism of the probe, in the order the overheads are fitted: each later kind's
    plan may include an earlier one's collectives (cp with zero 0 reduces gradients over cp).

    Context parallel is probed with all-to-all (Ulysses) attention only: the runtime's ring
    attention is a reference implementation (unfused blocks, contiguous split), slower than the
    load-balanced fused kernels the cost model assumes for ring CP, and is not what its fields
    should describe."""

    DP = "dp"
    FSDP = "fsdp"
    TP = "tp"
    CP = "cp"

    @property
    def overhead_field(self) -> str:
        """The Calibration field of its fixed per-layer overhead."""
        return f"{self.value}_layer_overhead_s"


def probe_plan(kind: ProbeKind, group_size: int = PROBE_GROUP_SIZE) -> Plan:
    """The plan of one probe: the parallelism alone, over ``group_size`` processes."""
    d = ParallelDims
    n = group_size
    return {
        ProbeKind.DP: Plan(dims=d(dp_replicate=n), zero=0, micro_batch=1),
        ProbeKind.FSDP: Plan(dims=d(dp_shard=n), zero=3, micro_batch=1),
        ProbeKind.TP: Plan(dims=d(tp=n), sp=True, micro_batch=1),
        ProbeKind.CP: Plan(dims=d(cp=n), cp_method=CPMethod.ALL_TO_ALL, micro_batch=1),
    }[kind]


def probe_job(plan: Plan, layers: int, cluster: ClusterSpec) -> Job:
    """The probe model with ``layers`` layers under ``plan``: one row of PROBE_SEQ_LEN tokens per
    data-parallel rank, fp32 (what CPU ranks compute in), on ``cluster`` sized to the plan."""
    model = model_preset(PROBE_MODEL).with_overrides({**PROBE_OVERRIDES, "num_layers": layers})
    training = TrainingSpec(seq_len=PROBE_SEQ_LEN, global_batch=plan.dims.dp, precision=Precision.FP32)
    return Job(model=model, training=training, cluster=cluster.with_gpus(plan.dims.world_size),
               plan=plan.with_defaults(model))
