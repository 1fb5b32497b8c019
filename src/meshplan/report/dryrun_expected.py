"""The collectives the cost model charges one rank per step, by kind and group (no torch).

Counts and buffer bytes follow the terms of cost/layer.py and cost/batch.py, for the layers that
pipeline rank ``pp_rank`` holds and ``m`` micro-batches; a buffer is an all-gather's output, a
reduce-scatter's input, an all-reduce's tensor, an all-to-all's per-rank input, a send's tensor
(the dry run's CollectiveCounter measures the same). Groups are the dry run's: tp, cp, ep, dp
(FSDP/DDP over dp_shard x cp, and dp_replicate), pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.cost.layer import activation_bytes
from meshplan.cost.vocab import SOFTMAX_MAX_BYTES_PER_TOKEN, SOFTMAX_SUM_BYTES_PER_TOKEN
from meshplan.plan import CPMethod, Job

GROUP_OF_AXIS = {
    "tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "pp_tied": "pp", "pp_vocab": "pp",
    "dp_shard_cp": "dp", "dp_shard": "dp", "dp_cp": "dp", "dp": "dp", "dp_replicate": "dp",
    "edp": "dp", "dp_edp": "dp",
}
"""Mesh axis (as the dry run names it) -> the group the cost model charges it to."""


def group_of(axis: str, kind: str) -> str:
    """The cost-model group of a dry-run collective on ``axis`` ('a=b' when one process group
    serves several axes): an all-to-all on a group that is also the ep group is expert parallel."""
    axes = axis.split("=")
    if kind == "all_to_all" and "ep" in axes:
        return "ep"
    for a in axes:
        if a in GROUP_OF_AXIS:
            return GROUP_OF_AXIS[a]
    return axis


@dataclass(frozen=True)
class ExpectedCollective:
    group: str
    kind: str
    count: float
    total_bytes: float


def expected_collectives(job: Job, pp_rank: int) -> list[ExpectedCollective]:
    """What the cost model charges pipeline rank ``pp_rank`` for one step (see module docstring)."""
    model, training = job.model, job.training
    plan = job.full_plan
    d = plan.dims
    calib = calibration_for(job.cluster.gpu)
    ab = activation_bytes(training.precision)
    m = plan.num_microbatches(training)
    layers = plan.layers_on_rank(pp_rank)
    moe_layers = 0
    if model.is_moe:  # leading dense layers sit on the first stages
        ids = [i for s, n in enumerate(plan.stage_layers) if plan.stage_rank(s) == pp_rank
               for i in range(sum(plan.stage_layers[:s]), sum(plan.stage_layers[:s]) + n)]
        moe_layers = sum(1 for i in ids if i >= model.moe_dense_layers)
    t, c = d.tp, d.cp
    T = plan.micro_batch * training.seq_len / c  # tokens of one micro-batch on this rank
    D = model.hidden_size
    act_msg = T * D * ab
    kv_local = max(model.num_kv_heads / t, 1.0) * model.head_dim
    out: list[ExpectedCollective] = []
    per = layers * m  # layer passes per step
    if t > 1:  # Megatron f/g: 2 per layer forward, 2 backward (SP: all-gather + reduce-scatter)
        if plan.sp:
            out += [ExpectedCollective("tp", "all_gather", 4 * per, 4 * per * act_msg),
                    ExpectedCollective("tp", "reduce_scatter", 4 * per, 4 * per * act_msg)]
        else:
            out.append(ExpectedCollective("tp", "all_reduce", 4 * per, 4 * per * act_msg))
    if c > 1:
        kv_msg = T * 2 * kv_local * ab
        if plan.cp_method == CPMethod.RING:  # forward (c-1) K/V hops, backward 2(c-1)
            out.append(ExpectedCollective("cp", "send", 3 * (c - 1) * per, 3 * (c - 1) * per * kv_msg))
        else:  # Ulysses: q, k, v in and the output back, forward and backward
            nbytes = T * (2 * model.q_size / t + 2 * kv_local) * ab
            out.append(ExpectedCollective("cp", "all_to_all", 2 * per, 2 * per * nbytes))
    if d.ep > 1 and moe_layers:
        nbytes = T / t * model.moe_top_k * D * ab
        n = 4 * moe_layers * m  # dispatch + combine, forward and backward
        out.append(ExpectedCollective("ep", "all_to_all", n, n * nbytes))
    out += _data_parallel(job, pp_rank, m, calib)
    if d.pp > 1:  # activation out and its gradient back, per virtual stage and micro-batch
        n = 2 * plan.vpp * m
        out.append(ExpectedCollective("pp", "send", n, n * T * D * ab / t))
    if plan.vocab_parallel:
        out += _vocab_parallel(T, D, ab, m)
    return out


def _vocab_parallel(T: float, D: int, ab: float, m: int) -> list[ExpectedCollective]:
    """cost/vocab.py, on every pipeline rank: per micro-batch the head input broadcast and its
    gradient reduced, the softmax's max and (sum, target logit) all-reduced; per step the
    embedding rows of the m micro-batches reduced and their gradient broadcast."""
    rows = T * D * ab
    stats = T * (SOFTMAX_MAX_BYTES_PER_TOKEN + SOFTMAX_SUM_BYTES_PER_TOKEN)
    return [ExpectedCollective("pp", "broadcast", m + 1, 2 * m * rows),
            ExpectedCollective("pp", "reduce", m + 1, 2 * m * rows),
            ExpectedCollective("pp", "all_reduce", 2 * m, m * stats)]


def _data_parallel(job: Job, pp_rank: int, m: int, calib) -> list[ExpectedCollective]:
    """ZeRO-0: all-reduce gradients; 1/2: reduce-scatter gradients + all-gather weights once per
    step; 3: all-gather weights forward and backward and reduce-scatter gradients per micro-batch
    (cost/batch.py); plus the dp_replicate all-reduce of the sharded gradients (HSDP)."""
    plan = job.full_plan
    d = plan.dims
    n1 = d.dp_shard * d.cp
    if n1 * d.dp_replicate == 1:
        return []
    est = estimate(job.model, job.cluster, job.training, job.plan)
    stage = est.stages[pp_rank]
    gb = calib.grad_bytes_per_param(job.training.precision)
    shards_g = n1 if plan.zero >= 2 else 1
    params = stage.memory.gradients_bytes * shards_g / gb  # this rank's parameters before ZeRO
    g_bytes, w_bytes = params * gb, params * calib.weight_bytes_per_param
    out: list[ExpectedCollective] = []
    if n1 > 1:
        if plan.zero == 0:
            out.append(ExpectedCollective("dp", "all_reduce", 1, g_bytes))
        elif plan.zero <= 2:
            out += [ExpectedCollective("dp", "reduce_scatter", 1, g_bytes),
                    ExpectedCollective("dp", "all_gather", 1, w_bytes)]
        else:
            out += [ExpectedCollective("dp", "all_gather", 2 * m, 2 * m * w_bytes),
                    ExpectedCollective("dp", "reduce_scatter", m, m * g_bytes)]
    if d.dp_replicate > 1:
        out.append(ExpectedCollective("dp", "all_reduce", 1, g_bytes / (n1 if plan.zero >= 1 else 1)))
    return out
