"""Ring collectives across NVLink domains run at min(NVLink, g x NIC per GPU), g = members of the
group in one domain (cost/comms.py); all-to-all and send/recv keep each rank's own NIC share.

Golden values by hand: DGX H100 = 8 GPUs with 8 x 400 Gb/s NICs (50 GB/s per GPU), NVLink
450 GB/s per direction; GB200 NVL72 = 72 GPUs on one NVLink switch (900 GB/s), 50 GB/s NIC per GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import comms
from meshplan.cost.calibration import Calibration
from meshplan.cost.step import estimate
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

CAL = Calibration()
NIC = 50e9 * CAL.inter_node_comm_efficiency


def test_dgx_data_parallel_over_whole_nodes_gets_the_nodes_nics():
    dgx = system_preset("dgx-h100", num_nodes=8)
    link = comms.group_link(dgx, CAL, 64, 1)  # 8 members per node
    assert float(link.rates("all_reduce")[1]) == pytest.approx(8 * NIC)  # 400 GB/s < NVLink 450
    assert float(link.rates("all_to_all")[1]) == pytest.approx(NIC)  # own bytes, own NIC
    assert float(link.rates("send_recv")[1]) == pytest.approx(NIC)
    # tensor parallel 8 inside the node: the data-parallel group has one member per node
    assert float(comms.group_link(dgx, CAL, 8, 8).rates("all_gather")[1]) == pytest.approx(NIC)
    # tp 2: four members per node share four NICs
    assert float(comms.group_link(dgx, CAL, 32, 2).rates("reduce_scatter")[1]) == pytest.approx(4 * NIC)


def test_ring_capped_by_nvlink():
    rack = system_preset("gb200-nvl72", num_nodes=32)  # 128 GPUs: two racks
    link = comms.group_link(rack, CAL, 64, 2)  # FSDP over 64 ranks two apart: 36 per rack
    nvlink = 900e9 * CAL.intra_node_comm_efficiency
    assert float(link.rates("all_gather")[1]) == pytest.approx(nvlink)
    assert float(link.rates("all_to_all")[1]) == pytest.approx(NIC)
    # a group inside one domain is NVLink for every op
    inside = comms.group_link(rack, CAL, 64, 1)
    assert float(inside.rates("all_to_all")[1]) == pytest.approx(nvlink)


@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from([2, 4, 8, 16, 64, 256]), stride=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_ring_bandwidth_between_nic_and_nvlink(size, stride):
    dgx = system_preset("dgx-h100", num_nodes=64)
    link = comms.group_link(dgx, CAL, size, stride)
    _, ring = link.rates("all_gather")
    _, own = link.rates("all_to_all")
    nvlink = 450e9 * CAL.intra_node_comm_efficiency
    assert NIC - 1e-6 <= float(own) <= float(ring) + 1e-6
    assert float(ring) <= max(nvlink, NIC) + 1e-6
    # more members per node never slows the ring
    wider = comms.group_link(dgx, CAL, size, max(stride // 2, 1)).rates("all_gather")[1]
    assert float(wider) >= float(ring) - 1e-6


def test_expert_gradients_reduce_over_the_expert_group_link():
    """A MoE plan whose dense dp group spans nodes 8 per node while the expert-dp group has one
    member per node: the dense gradients' reduce is cheap, the experts' is NIC-bound. Raising
    only the inter-node efficiency must speed the step up (the expert group uses the NICs)."""
    model = model_preset("qwen3-30b-a3b")
    dgx = system_preset("dgx-h100", num_nodes=8)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    plan = Plan(dims=ParallelDims(dp_shard=64, ep=8), zero=1)
    base = estimate(model, dgx, training, plan, CAL)
    faster_nics = estimate(model, dgx, training, plan, CAL.replace_fields(inter_node_comm_efficiency=1.0))
    assert faster_nics.time.dp_comm_total_s < base.time.dp_comm_total_s
    # the expert share is the bulk of the parameters: NIC-bound, so about 1/efficiency apart
    ratio = base.time.dp_comm_total_s / faster_nics.time.dp_comm_total_s
    assert ratio == pytest.approx(1.0 / CAL.inter_node_comm_efficiency, rel=0.15)
    assert np.isfinite(base.step_time_s)
