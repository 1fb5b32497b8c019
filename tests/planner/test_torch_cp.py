"""torch's ring attention (torchtitan's context parallel) timed as it runs (cost/torch_cp.py;
pytorch/pytorch torch/distributed/tensor/experimental/_attention.py@f2127db). Worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.comms import Link
from meshplan.cost.torch_cp import torch_cp_cost
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

LINK = Link(bandwidth_bytes_per_s=np.array([1e11]), latency_s=np.array([0.0]))
# b 1, S 8192, 32 heads of 128 (Llama-3.1-8B at tp 1), bf16, peak 1e15, HBM 2e12, backward 2.5x
SHAPE = {"micro_batch": 1.0, "seq_len": 8192.0, "heads": 32.0, "dqk": 128.0, "dv": 128.0, "ab": 2.0,
         "core_peak": 1e15, "hbm": 2e12, "bwd_ratio": 2.5, "cp_link": LINK}


def _flat(kv_len, causal, backward):
    return 0.5


def test_cp2_by_hand():
    got = torch_cp_cost(c=np.array([2.0]), efficiency=_flat, **SHAPE)
    # rank-local: 32 heads x 4096 rows = 131072 rows; E = 131072 x 128 = 2^24 elements per Q, K, V
    E = 2.0**24
    # step 0: causal 4096 x 4096, 2 x 131072 x 4096 x 256 / 2 = 1.374e11 FLOP; step 1: 4096 x 2048
    # non-causal, the same FLOPs; each at 0.5 of 1e15
    step = 131072 * 4096 * 256 / 0.5e15
    assert step == pytest.approx(2.74877906944e-4)
    # merge of step 1: cast 6 + 3 fp32 ops x 12 = 42 B per output element; K|V cat 4 B x 2E; final cast 6
    merge = (42 * E + 4 * 2 * E + 6 * E) / 2e12
    np.testing.assert_allclose(got.core_s, [2 * step + merge])
    # backward: zero-fill 4 x 3E, step 0 adds 10 x 3E, step 1 (half-chunk add 5 + cat 8) x 2E + dQ add
    # 10 x E + K|V cat 4 x 2E, two fp32 dK|dV cats 8 x 2E each, final casts 6 x 3E: 136 E bytes
    accum = (12 + 30 + 26 + 10 + 8 + 32 + 18) * E / 2e12
    np.testing.assert_allclose(got.core_bwd_s, [2 * 2.5 * step + accum])
    # all-gather of K and V (2 x 2E x 2 B over 2 ranks): half of 2^27 B at 1e11 B/s, behind step 0 only
    gather = 2.0**26 / 1e11
    np.testing.assert_allclose(got.fwd_comm_s, [gather])
    np.testing.assert_allclose(got.fwd_exposed_s, [gather - step])
    # backward: the gather hides behind step 0's backward; fp32 dK|dV (2E x 4 B) sent twice, the first
    # behind step 1's backward, the last after the loop
    send = 2 * E * 4 / 1e11
    np.testing.assert_allclose(got.bwd_comm_s, [gather + 2 * send])
    np.testing.assert_allclose(got.bwd_exposed_s, [(send - 2.5 * step) + send])


def test_compiled_merge_is_one_pass():
    """torch.compile fuses the merge's cast and three fp32 ops: 2 + 4 + 4 = 10 B per element, not 42."""
    eager = torch_cp_cost(c=np.array([2.0]), efficiency=_flat, **SHAPE)
    fused = torch_cp_cost(c=np.array([2.0]), efficiency=_flat, eager=False, **SHAPE)
    np.testing.assert_allclose(eager.core_s - fused.core_s, [(42 - 10) * 2.0**24 / 2e12])
    np.testing.assert_allclose(fused.core_bwd_s, eager.core_bwd_s)


def test_compiled_ring_waits_where_it_issues():
    """Traced by torch.compile, every functional collective is waited right after it is issued
    (_functional_collectives._maybe_wrap_tensor; Inductor's overlap reordering is off by default):
    cp 2 by hand, nothing of the gather or the two fp32 dK|dV sends hides behind a step."""
    fused = torch_cp_cost(c=np.array([2.0]), efficiency=_flat, eager=False, **SHAPE)
    E = 2.0**24
    gather = 2.0**26 / 1e11  # half of K|V (2 x 2E x 2 B) over 2 ranks at 1e11 B/s
    send = 2 * E * 4 / 1e11  # fp32 dK|dV
    np.testing.assert_allclose(fused.fwd_exposed_s, [gather])
    np.testing.assert_allclose(fused.bwd_exposed_s, [gather + 2 * send])
    np.testing.assert_allclose(fused.bwd_comm_s, fused.bwd_exposed_s)
    # eager: the same traffic, the gather partly and the first send wholly behind a step (above)
    eager = torch_cp_cost(c=np.array([2.0]), efficiency=_flat, **SHAPE)
    np.testing.assert_allclose(eager.bwd_comm_s, fused.bwd_comm_s)
    assert eager.bwd_exposed_s[0] < fused.bwd_exposed_s[0] and eager.fwd_exposed_s[0] < fused.fwd_exposed_s[0]


def test_each_call_at_its_own_kv_length():
    seen = []

    def record(kv_len, causal, backward):
        seen.append((float(np.asarray(kv_len).ravel()[0]), causal, backward))
        return 0.5

    torch_cp_cost(c=np.array([8.0]), efficiency=record, **SHAPE)
    # S/c = 1024: step 0 causal on 1024 keys, the later steps non-causal on 512 keys (rank c-1)
    assert sorted(seen) == sorted([(1024.0, True, False), (512.0, False, False),
                                   (1024.0, True, True), (512.0, False, True)])


def test_no_cp_costs_nothing():
    got = torch_cp_cost(c=np.array([1.0]), efficiency=_flat, **SHAPE)
    for field in ("core_s", "core_bwd_s", "fwd_comm_s", "bwd_comm_s", "fwd_exposed_s", "bwd_exposed_s"):
        assert getattr(got, field)[0] == 0.0


MODEL = model_preset("llama3-8b")
CLUSTER = system_preset("dgx-h100", 1)
TRAINING = TrainingSpec(seq_len=131072, global_batch=8, precision="bf16")
TORCH_CP = Calibration().replace_fields(cp_ring_gathers_kv=True)


def _plan(cp: int, method: CPMethod = CPMethod.RING) -> Plan:
    return Plan(dims=ParallelDims(dp_shard=8 // cp, cp=cp), zero=3, micro_batch=1,
                recompute=Recompute.FULL, cp_method=method)


def test_estimate_charges_it_only_for_torch_cp_plans():
    slower = estimate(MODEL, CLUSTER, TRAINING, _plan(4), TORCH_CP).step_time_s
    assert slower > estimate(MODEL, CLUSTER, TRAINING, _plan(4), Calibration()).step_time_s
    for plan in (_plan(1), _plan(4, CPMethod.ALL_TO_ALL)):  # no ring: unchanged
        assert estimate(MODEL, CLUSTER, TRAINING, plan, TORCH_CP).step_time_s == pytest.approx(
            estimate(MODEL, CLUSTER, TRAINING, plan, Calibration()).step_time_s)


def test_target_torchtitan_runs_torchs_cp():
    """``--target torchtitan`` estimates with the torchtitan framework's settings, torch's ring
    attention among them; meshplan's runtime runs its own ring (runtime/parallelize.py)."""
    from meshplan.calib.hardware import target_calibration

    assert target_calibration(CLUSTER, "torchtitan").cp_ring_gathers_kv
    assert not target_calibration(CLUSTER, "meshplan").cp_ring_gathers_kv
