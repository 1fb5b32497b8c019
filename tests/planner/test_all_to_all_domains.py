"""An all-to-all across NVLink domains sends (g-1)/n of a rank's bytes over NVLink and (n-g)/n
through its NIC share, concurrently (cost/comms.py); DeepEP's flex dispatcher sends one copy per
destination domain over the NICs and forwards it over NVLink, once per picked rank (cost/moe.py).

Golden values by hand: DGX H100 = 8 GPUs per node, NVLink 450 GB/s per direction, 8 x 400 Gb/s
NICs (50 GB/s per GPU), alpha 3 us inside, 8 us across; GB200 NVL72 = 72 GPUs on one NVLink
switch at 900 GB/s per GPU. Default calibration: NVLink at 0.75, NICs at 0.80 of the rate.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost import comms
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.moe import dispatch_time, group_hit_share
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import MoeDispatcher, TrainingSpec

CAL = Calibration()
NVL_H100 = 450e9 * 0.75  # 337.5 GB/s
NIC = 50e9 * 0.80  # 40 GB/s


def test_two_node_ep16_golden():
    """ep16 over two DGX H100 nodes: 7/16 of the bytes to the 7 node peers over NVLink, 8/16 to
    the other node over the rank's own NIC share, at once; one alpha per peer."""
    dgx = system_preset("dgx-h100", num_nodes=2)
    link = comms.group_link(dgx, CAL, 16, 1)
    B = 1.6e9
    intra_s = 7 / 16 * B / NVL_H100  # 2.074 ms
    inter_s = 8 / 16 * B / NIC  # 20 ms: the NIC sets the pace
    lat_s = 7 * 3e-6 + 8 * 8e-6  # 85 us
    assert intra_s < inter_s
    assert float(comms.all_to_all_time(B, 16, link)) == pytest.approx(inter_s + lat_s, rel=1e-12)
    # before: all 15/16 of the bytes at one NIC share, 15 NIC alphas
    assert float(comms.all_to_all_time(B, 16, link)) < 15 / 16 * B / NIC + 15 * 8e-6


def test_in_domain_ep64_nvl72_golden():
    """ep64 inside one GB200 NVL72 rack: all 63/64 of the bytes over NVLink, as the ring formula."""
    rack = system_preset("gb200-nvl72", num_nodes=16)  # 64 GPUs of one rack
    link = comms.group_link(rack, CAL, 64, 1)
    B = 377.5e6  # GPT-OSS-120B, mb 4 x 4096 tokens x top-4 x 2880 x 2 B
    want = 63 / 64 * B / (900e9 * 0.75) + 63 * rack.intra_node_latency_s
    assert float(comms.all_to_all_time(B, 64, link)) == pytest.approx(want, rel=1e-12)


def test_nic_bound_part_scales_with_the_remote_share():
    """Across nodes the NIC part, (n-g)/n of the bytes, sets the time when NVLink is faster."""
    dgx = system_preset("dgx-h100", num_nodes=8)
    B = 1e9
    for n in (16, 32, 64):
        link = comms.group_link(dgx, CAL, n, 1)
        lat_s = 7 * 3e-6 + (n - 8) * 8e-6
        assert float(comms.all_to_all_time(B, n, link)) == pytest.approx((n - 8) / n * B / NIC + lat_s)


def test_one_member_per_domain_keeps_the_nic_formula():
    """tp 8 inside the node, the group across nodes: g = 1, all (n-1)/n over the NIC."""
    dgx = system_preset("dgx-h100", num_nodes=4)
    link = comms.group_link(dgx, CAL, 4, 8)
    B = 1e9
    assert float(comms.all_to_all_time(B, 4, link)) == pytest.approx(3 / 4 * B / NIC + 3 * 8e-6)


@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from([2, 4, 8, 16, 32, 64, 128]), stride=st.sampled_from([1, 2, 4, 8, 16]),
       nbytes=st.floats(1e3, 1e10))
def test_split_between_nvlink_and_nic_bounds(size, stride, nbytes):
    """The split all-to-all is never faster than all of it over NVLink, never slower than all of
    it over one NIC share, and broadcasts over plan arrays."""
    dgx = system_preset("dgx-h100", num_nodes=64)
    link = comms.group_link(dgx, CAL, size, stride)
    t = float(comms.all_to_all_time(nbytes, size, link))
    share = (size - 1) / size * nbytes
    assert share / NVL_H100 - 1e-12 <= t
    assert t <= share / min(NIC, NVL_H100) + (size - 1) * 8e-6 + 1e-12
    sizes = np.array([size, size])
    arr = comms.all_to_all_time(nbytes, sizes, comms.group_link(dgx, CAL, sizes, np.array([stride, stride])))
    assert np.allclose(arr, t)


def _dispatch(system: str, nodes: int, ep: int, dispatcher: MoeDispatcher):
    model = model_preset("qwen3-30b-a3b")
    cluster = system_preset(system, num_nodes=nodes)
    training = TrainingSpec(seq_len=4096, global_batch=1024, moe_dispatcher=dispatcher)
    plan = Plan(dims=ParallelDims(dp_shard=cluster.num_gpus, ep=ep), zero=1, micro_batch=1).with_defaults(model)
    plans = PlanArrays.from_plans([plan])
    T = 4096.0
    return float(dispatch_time(model, cluster, training, plans, CAL, T=np.array([T]), ab=2.0, load=1.0)[0]), model


def test_flex_dispatch_two_stage_golden():
    """DeepEP on ep16 over two DGX H100 nodes, Qwen3-30B-A3B (E=128 experts, top-8, 8 per rank):
    a token travels once per picked node and once per picked rank, not once per copy. Over the
    NIC one copy per token if the other node's 64 experts hold one of its 8, 1 - C(64,8)/C(128,8);
    over NVLink the picked ones of the 7 node peers and of the other node's 7 ranks forwarded from
    the rail peer, 14 ranks each picked with 1 - C(120,8)/C(128,8): the NIC part sets the time."""
    t, model = _dispatch("dgx-h100", 2, 16, MoeDispatcher.FLEX)
    assert (model.moe_num_experts, model.moe_top_k) == (128, 8)
    copy_b = 4096 * model.hidden_size * 2.0
    node_hit = 1 - comb(64, 8) / comb(128, 8)  # 0.99712
    rank_hit = 1 - comb(120, 8) / comb(128, 8)  # 0.40406
    inter_b = copy_b * node_hit
    intra_b = copy_b * rank_hit * (7 + 8 * 7 / 8)
    one = max(intra_b / NVL_H100, inter_b / NIC) + 7 * 3e-6 + 8 * 8e-6
    assert t == pytest.approx(2.0 * one, rel=1e-12)  # dispatch + combine
    alltoall, _ = _dispatch("dgx-h100", 2, 16, MoeDispatcher.ALLTOALL)
    assert t < alltoall  # 0.997 copies over the NIC instead of 4


def test_flex_inside_one_domain_sends_once_per_picked_rank():
    """ep8 in one DGX H100 node, 16 of the 128 experts per rank, top-8: each of the 7 peers gets a
    token with probability 1 - C(112,8)/C(128,8) = 0.6672, where alltoall sends it k/n = 1 time
    per peer on average: flex moves 0.667 of alltoall's bytes; the latencies are the same."""
    flex, model = _dispatch("dgx-h100", 1, 8, MoeDispatcher.FLEX)
    alltoall, _ = _dispatch("dgx-h100", 1, 8, MoeDispatcher.ALLTOALL)
    copy_b = 4096 * model.hidden_size * 2.0
    lat_s = 7 * 3e-6
    rank_hit = 1 - comb(112, 8) / comb(128, 8)
    assert flex == pytest.approx(2.0 * (7 * rank_hit * copy_b / NVL_H100 + lat_s), rel=1e-12)
    assert alltoall == pytest.approx(2.0 * (7 / 8 * 8 * copy_b / NVL_H100 + lat_s), rel=1e-12)
    assert (flex / 2 - lat_s) / (alltoall / 2 - lat_s) == pytest.approx(rank_hit, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(experts_log2=st.integers(3, 9), groups_log2=st.integers(0, 6), k=st.integers(1, 16))
def test_group_hit_share_between_with_replacement_and_the_union_bound(experts_log2, groups_log2, k):
    """k distinct experts pick a group of E/m at least as often as k independent draws would,
    1 - (1 - 1/m)^k, and at most k/m (union bound) or 1; one draw: exactly 1/m."""
    E, m = 2.0 ** experts_log2, 2.0 ** groups_log2
    if m > E or k > E:
        return
    h = float(group_hit_share(E, m, k))
    assert 1 - (1 - 1 / m) ** k - 1e-12 <= h <= min(1.0, k / m) + 1e-12
    assert float(group_hit_share(E, m, 1)) == pytest.approx(1 / m, rel=1e-12)
    assert float(group_hit_share(E, 1.0, k)) == 1.0  # one group holds every expert
