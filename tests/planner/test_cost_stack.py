"""Overlap and fixed host costs as each stack has them (issue 14 item 3, issue 15 item 1)."""

from __future__ import annotations

import pytest

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODEL = model_preset("llama3-8b")
CLUSTER = system_preset("dgx-h100")
TRAINING = TrainingSpec(seq_len=4096, global_batch=64)


def _est(calib, **dims):
    plan = Plan(dims=ParallelDims(**dims), micro_batch=1)
    return estimate(MODEL, CLUSTER, TRAINING, plan, calib)


def test_tp_overlap_hides_tp_collectives_and_nothing_else():
    base = calibration_for(CLUSTER.gpu, "meshplan").replace_fields(microbatch_overhead_s=0.0)
    none, full = base.replace_fields(tp_overlap=0.0), base.replace_fields(tp_overlap=1.0)
    tp = (_est(none, tp=8), _est(full, tp=8))
    assert tp[1].step_time_s < tp[0].step_time_s  # TP's collectives were exposed, now hidden
    dp = (_est(none, dp_replicate=8), _est(full, dp_replicate=8))
    assert dp[1].step_time_s == pytest.approx(dp[0].step_time_s, rel=1e-12)  # no TP, no change


def test_megatron_credits_tp_overlap_that_meshplan_does_not():
    """Megatron-Core's --tp-comm-overlap hides TP traffic; meshplan's DTensor TP does not. Same
    hardware factors on both sides, so only the stacks' mechanisms differ."""
    megatron = calibration_for(CLUSTER.gpu, "megatron")
    mesh = megatron.replace_fields(tp_overlap=calibration_for(CLUSTER.gpu, "meshplan").tp_overlap)
    assert _est(megatron, tp=8).step_time_s < _est(mesh, tp=8).step_time_s


@pytest.mark.parametrize("m", [1, 4, 16])
def test_microbatch_overhead_is_paid_once_per_microbatch(m):
    """pp = 1: the step is m micro-batches back to back, so a fixed host cost h per micro-batch
    adds exactly m * h (hand count)."""
    h = 2e-3
    base = calibration_for(CLUSTER.gpu, "megatron").replace_fields(microbatch_overhead_s=0.0)
    training = TrainingSpec(seq_len=2048, global_batch=8 * m)
    plan = Plan(dims=ParallelDims(dp_replicate=8), micro_batch=1)
    t0 = estimate(MODEL, CLUSTER, training, plan, base).step_time_s
    t1 = estimate(MODEL, CLUSTER, training, plan, base.replace_fields(microbatch_overhead_s=h)).step_time_s
    assert t1 - t0 == pytest.approx(m * h, rel=1e-6)


def test_cross_node_groups_run_at_the_nodes_nic_bandwidth():
    """A group that leaves the scale-up domain gets NICs x line rate / GPUs per node, times the
    stack's inter-node efficiency (covhw's cluster fields, used by comms)."""
    from meshplan.cost import comms

    cluster = system_preset("dgx-h100", num_nodes=4)
    calib = calibration_for(cluster.gpu, "megatron")
    link = comms.group_link(cluster, calib, size=4, stride=8)  # one rank per node
    per_gpu = cluster.nics_per_node * cluster.nic_bandwidth_bytes_per_s / cluster.gpus_per_node
    assert cluster.nics_per_node > 0
    assert float(link.bandwidth_bytes_per_s) == pytest.approx(per_gpu * calib.inter_node_comm_efficiency)
    inside = comms.group_link(cluster, calib, size=8, stride=1)
    assert float(inside.bandwidth_bytes_per_s) == pytest.approx(
        cluster.intra_node_bandwidth_bytes_per_s * calib.intra_node_comm_efficiency)


@pytest.mark.parametrize("stack", ["meshplan", "megatron", "torchtitan", "deepspeed"])
def test_context_parallel_does_not_replace_tensor_parallel_at_short_sequences(stack):
    """Issue 15: with TP given no overlap credit and ring CP 80% for every stack, cp2 tp4 was
    estimated far faster than tp8 for GPT-3 175B at sequence 2048. With each stack's own
    overlaps, a short sequence gives CP no real advantage (within 5%) under any stack."""
    model = model_preset("gpt3-175b")
    cluster = system_preset("dgx-a100", num_nodes=128)
    training = TrainingSpec(seq_len=2048, global_batch=1536)
    calib = calibration_for(cluster.gpu, stack)

    def step(**dims):
        plan = Plan(dims=ParallelDims(dp_replicate=16, pp=8, **dims), micro_batch=1, sp=True)
        return estimate(model, cluster, training, plan, calib).step_time_s

    assert step(tp=4, cp=2) >= 0.95 * step(tp=8)
