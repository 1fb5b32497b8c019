"""torch's ring attention (torchtitan's context parallel) holds the whole sequence's K and V and
the backward's fp32 gradient buffers during one attention layer (cost/cp_ring_memory.py;
pytorch/pytorch torch/distributed/tensor/experimental/_attention.py@f2127db). Worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.cp_ring_memory import torch_ring_transient_bytes
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODEL = model_preset("llama3.1-405b")  # 128 heads of 128, 8 KV heads (repeated to 128 before SDPA)
TORCH_CP = Calibration().replace_fields(cp_ring_gathers_kv=True)
CLUSTER = system_preset("dgx-h100", 64)  # 512 GPUs: tp8 x pp8 x cp8 (dp 1)
TOKENS = 32768.0  # b S / c on each rank: tt-15..18's 1 x 32768 x cp / cp


def _plans(*plans: Plan) -> PlanArrays:
    return PlanArrays.from_plans(list(plans))


def _plan(cp: int, method: CPMethod = CPMethod.RING) -> Plan:
    return Plan(dims=ParallelDims(dp_shard=8 // cp, tp=8, pp=8, cp=cp), zero=3, micro_batch=1,
                recompute=Recompute.FULL, cp_method=method)


def test_by_hand():
    plans = _plans(_plan(1), _plan(2), _plan(8), _plan(8, CPMethod.ALL_TO_ALL))
    got = torch_ring_transient_bytes(MODEL, TORCH_CP, plans, tokens_per_microbatch=TOKENS, tp=8.0,
                                     activation_bytes=2.0)
    # per tensor-parallel rank SDPA sees 128 / 8 = 16 heads of 128: 2048 wide, 32768 x 2048 = 2^26 elements
    local = 2.0**26
    fp32 = (3 + 4) * 4 * local  # dQ dK dV accumulators + dK dV sent and received, fp32: 1.75 GiB
    assert fp32 / GIB == pytest.approx(1.75)
    gathered_cp2 = 2 * 2 * local * 2  # K and V of the whole sequence (2 x 32768 tokens), bf16: 0.5 GiB
    gathered_cp8 = 2 * 8 * local * 2  # 2 GiB
    np.testing.assert_allclose(got, [0.0, gathered_cp2 + fp32, gathered_cp8 + fp32, 0.0])
    assert got[2] / GIB == pytest.approx(3.75)


def test_only_for_stacks_that_run_torchs_cp():
    plans = _plans(_plan(8))
    assert torch_ring_transient_bytes(MODEL, Calibration(), plans, tokens_per_microbatch=TOKENS, tp=8.0,
                                      activation_bytes=2.0) == 0.0


def test_the_peak_holds_the_larger_of_the_ring_and_the_logits():
    """The ring's buffers live inside a layer's backward, after the loss freed the logits."""
    training = TrainingSpec(seq_len=262144, global_batch=8, precision="bf16")  # tt-18's shape
    plan = Plan(dims=ParallelDims(dp_shard=1, tp=8, pp=8, cp=8), zero=3, micro_batch=1, recompute=Recompute.FULL)
    plain = estimate(MODEL, CLUSTER, training, plan, Calibration())
    ring = estimate(MODEL, CLUSTER, training, plan, TORCH_CP)
    first_plain, first_ring = plain.stages[0].memory, ring.stages[0].memory
    assert first_plain.logits_bytes == 0.0  # rank 0 holds no logits: the whole 3.75 GiB
    assert (first_ring.activations_bytes - first_plain.activations_bytes) / GIB == pytest.approx(3.75)
    last_plain, last_ring = plain.stages[-1].memory, ring.stages[-1].memory
    # the last rank's logits: 32768 tokens x ~128k / 8 vocabulary x 6 bytes, about 2.95 GiB < 3.75
    assert 2.9 * GIB < last_plain.logits_bytes < 3.75 * GIB
    assert (last_ring.activations_bytes - last_plain.activations_bytes) == pytest.approx(
        3.75 * GIB - last_plain.logits_bytes)
