"""The step time split into named terms (issue 15 item 4): the terms add up to the step, each
kind of exposed communication appears only when its parallelism is used, and a golden case is
checked by hand."""

from __future__ import annotations

import pytest

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.plan import ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

CLUSTER = system_preset("dgx-h100", num_nodes=4)  # 32 GPUs
TRAINING = TrainingSpec(seq_len=8192, global_batch=64)

CASES = [
    ("llama3-8b", Plan(dims=ParallelDims(dp_shard=32), zero=3)),
    ("llama3-8b", Plan(dims=ParallelDims(dp_shard=8, tp=4), zero=2, sp=True)),
    ("llama3-8b", Plan(dims=ParallelDims(dp_replicate=2, dp_shard=2, tp=2, cp=2, pp=2), zero=1, sp=True,
                       schedule=Schedule.INTERLEAVED_1F1B, vpp=2, recompute=Recompute.SELECTIVE)),
    ("mixtral-8x7b", Plan(dims=ParallelDims(dp_shard=8, tp=2, pp=2, ep=8), zero=1, sp=True,
                          recompute=Recompute.FULL)),
]


@pytest.mark.parametrize("model_name,plan", CASES)
def test_terms_sum_to_the_step(model_name, plan):
    est = estimate(model_preset(model_name), CLUSTER, TRAINING, plan)
    terms = est.time.terms_s()
    assert all(v >= 0 for v in terms.values()), terms
    assert sum(terms.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    exposed = sum(v for k, v in terms.items() if k.startswith("exposed"))
    assert exposed + terms["collective host overhead"] == pytest.approx(est.time.exposed_communication_s, rel=1e-9)


@pytest.mark.parametrize("model_name,plan", CASES)
def test_each_kind_only_where_its_parallelism_is(model_name, plan):
    terms = estimate(model_preset(model_name), CLUSTER, TRAINING, plan).time.terms_s()
    d = plan.dims
    for key, used in (("exposed TP", d.tp > 1), ("exposed CP", d.cp > 1), ("exposed EP", d.ep > 1),
                      ("exposed PP p2p", d.pp > 1), ("exposed ZeRO per micro-batch", plan.zero >= 2)):
        if not used:
            assert terms[key] == pytest.approx(0.0, abs=1e-12), key


def test_pp_p2p_golden_without_overlap():
    """pp=2, no p2p overlap: per micro-batch one (b, S, D) bf16 activation forward and its gradient
    back (one chunk each way), m micro-batches: 2 * m * p2p_time(S * D * 2 bytes)."""
    from meshplan.cost import comms

    model = model_preset("llama3-8b")
    calib = calibration_for(CLUSTER.gpu).replace_fields(pp_p2p_overlap=0.0)
    plan = Plan(dims=ParallelDims(dp_shard=16, pp=2), zero=1)
    est = estimate(model, CLUSTER, TRAINING, plan, calib)
    m = TRAINING.global_batch // 16
    link = comms.group_link(CLUSTER, calib, 2, 16)
    one = float(comms.p2p_time(TRAINING.seq_len * model.hidden_size * 2.0, True, link))
    assert est.time.exposed_pp_s == pytest.approx(2 * m * one, rel=1e-9)


def test_zero3_traffic_is_its_own_term():
    """ZeRO-3's per-micro-batch gathers land in the ZeRO term, not in DP; ZeRO-1 has none."""
    model = model_preset("llama3-8b")
    calib = calibration_for(CLUSTER.gpu).replace_fields(fsdp_overlap=0.0)
    z3 = estimate(model, CLUSTER, TRAINING, Plan(dims=ParallelDims(dp_shard=32), zero=3), calib).time
    z1 = estimate(model, CLUSTER, TRAINING, Plan(dims=ParallelDims(dp_shard=32), zero=1), calib).time
    assert z3.exposed_zero_s > 0 and z1.exposed_zero_s == 0.0
