"""The accuracy-pass factors: vocabulary padding, head-dim alignment, per-layer fixed overhead,
loss temporaries and the OOM hinge of the memory fit. Golden values derived in each test."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import rank_cost
from meshplan.cost.calibration import Calibration
from meshplan.calib.fit import memory_loss
from meshplan.cost.layer import layer_cost
from meshplan.calib.validate import build_run
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

CLUSTER = system_preset("dgx-a100")
BASE = Calibration(fused_attention=False, dropout=True)


def gpt(D=4096, N=32, V=51200, L=4) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=L, hidden_size=D, num_heads=N, vocab_size=V,
                     tied_embeddings=True, max_position=2048)


def _plans(t=1, b=1):
    return PlanArrays.from_plans([Plan(dims=ParallelDims(tp=t), micro_batch=b)])


def _head(model, calib, t=8, b=1):
    plans = _plans(t, b)
    tr = TrainingSpec(seq_len=2048, global_batch=b)
    lc = layer_cost(model, CLUSTER, tr, plans, calib)
    return rank_cost(model, CLUSTER, tr, plans, calib, lc, rank=0, layers=0, recomputed=0,
                     has_embedding=False, has_head=True)


def test_vocab_padding_per_tp_rank():
    # 250,000 / 8 = 31,250 per rank is not a multiple of 8 (slow tensor-core path); Megatron pads
    # to a multiple of 128 per rank: 31,360 = 245 x 128 (= 250,880 in all, BLOOM's vocabulary).
    padded = _head(gpt(V=250_000), BASE)
    exact = _head(gpt(V=250_880), BASE)
    assert padded.compute_s[0] == pytest.approx(exact.compute_s[0])
    assert padded.activations_bytes[0] == pytest.approx(2048 * 31_360 * BASE.logits_bytes_per_element)
    unpadded = _head(gpt(V=250_000), replace(BASE, vocab_pad_multiple=1.0))
    # without padding the head GEMM runs at unaligned_matmul_factor (0.5 by default): slower
    assert unpadded.compute_s[0] > 1.5 * padded.compute_s[0]


def test_loss_temporaries_on_the_head_rank():
    extra = 4.0
    with_tmp = _head(gpt(V=51200), replace(BASE, loss_transient_bytes_per_element=extra), t=4, b=2)
    without = _head(gpt(V=51200), BASE, t=4, b=2)
    # S * b * V/t elements: 2048 * 2 * 12800
    assert with_tmp.activations_bytes[0] - without.activations_bytes[0] == pytest.approx(
        2048 * 2 * 12800 * extra)


@pytest.mark.parametrize("fused", [False, True])
def test_head_dim_not_multiple_of_8_slows_attention(fused):
    calib = replace(BASE, fused_attention=fused, dropout=not fused, unaligned_matmul_factor=0.1)
    tr = TrainingSpec(seq_len=2048, global_batch=1)
    # D = 13824: 128 heads -> head dim 108 (108 % 8 = 4); 96 heads -> 144 (aligned).
    bad = layer_cost(gpt(D=13824, N=128), CLUSTER, tr, _plans(), calib)
    good = layer_cost(gpt(D=13824, N=96), CLUSTER, tr, _plans(), calib)
    assert bad.fwd_compute_s[0] > good.fwd_compute_s[0] * 1.05
    assert bad.recompute_selective_s[0] > 5 * good.recompute_selective_s[0]


def test_layer_overhead_amortises_with_micro_batch():
    over = 1e-3
    tr = lambda b: TrainingSpec(seq_len=2048, global_batch=b)  # noqa: E731
    for b in (1, 4):
        base = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), BASE)
        more = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), replace(BASE, layer_overhead_s=over))
        assert more.fwd_compute_s[0] - base.fwd_compute_s[0] == pytest.approx(over)
        assert more.bwd_compute_s[0] - base.bwd_compute_s[0] == pytest.approx(2 * over)
    # tokens per second of one layer: the overhead costs mb=1 more than mb=4 (relative)
    def rel_loss(b):
        base = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), BASE)
        more = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), replace(BASE, layer_overhead_s=over))
        return float(more.fwd_compute_s[0] / base.fwd_compute_s[0])
    assert rel_loss(1) > rel_loss(4) > 1.0


def test_layer_overhead_on_host_is_hidden_behind_a_longer_layer():
    # Calibration.layer_overhead_on_host: on a GPU the overhead is host work issued while the
    # device runs the queue (cost/layer.py): a layer takes max(device time, overhead) forward and
    # max(device time, 2 x overhead) backward, so a layer longer than it hides it.
    host = replace(BASE, layer_overhead_on_host=True)
    tr = lambda b: TrainingSpec(seq_len=2048, global_batch=b)  # noqa: E731
    base = layer_cost(gpt(), CLUSTER, tr(1), _plans(8, 1), host)
    fwd0, bwd0 = float(base.fwd_compute_s[0]), float(base.bwd_compute_s[0])
    for over in (0.5 * fwd0, 3.0 * fwd0):  # hidden; then pacing the layer
        more = layer_cost(gpt(), CLUSTER, tr(1), _plans(8, 1), replace(host, layer_overhead_s=over))
        assert more.fwd_compute_s[0] == pytest.approx(max(fwd0, over), rel=1e-12)
        assert more.bwd_compute_s[0] == pytest.approx(max(bwd0, 2.0 * over), rel=1e-12)
    # host-bound at micro-batch 1 (3x the device time), device-bound at 4 (4x the tokens)
    over = 3.0 * fwd0
    def rel_loss(b):
        zero = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), host)
        more = layer_cost(gpt(), CLUSTER, tr(b), _plans(8, b), replace(host, layer_overhead_s=over))
        return float(more.fwd_compute_s[0] / zero.fwd_compute_s[0])
    assert rel_loss(1) == pytest.approx(3.0, rel=1e-12)
    assert rel_loss(4) == pytest.approx(1.0, rel=1e-12)


def test_layer_overhead_on_host_still_adds_on_a_cpu_device():
    # On a CPU host and device are one: the measured dispatch time adds to the layer's.
    cpu = system_preset("cpu").with_gpus(8)
    host = replace(BASE, layer_overhead_on_host=True)
    tr = TrainingSpec(seq_len=2048, global_batch=1, precision="fp32")
    base = layer_cost(gpt(), cpu, tr, _plans(8, 1), host)
    more = layer_cost(gpt(), cpu, tr, _plans(8, 1), replace(host, layer_overhead_s=1e-3))
    assert more.fwd_compute_s[0] - base.fwd_compute_s[0] == pytest.approx(1e-3)
    assert more.bwd_compute_s[0] - base.bwd_compute_s[0] == pytest.approx(2e-3)


ROW = dict(id="1", source="Synth", model="GPT", num_layers="8", hidden_size="2048", num_heads="16",
           vocab_size="51200", seq_len="2048", gpu="a100-80gb", num_gpus="8", gpus_per_node="8",
           global_batch_size="64", micro_batch_size="2", tp="2", recompute="full", precision="fp16",
           flops_basis="hardware", measured_tflops_per_gpu="100", notes="OOM")


def test_memory_loss_counts_oom_rows_one_sided():
    run = build_run(ROW)
    assert run.oom and run.measured_memory_gib is None
    small = BASE  # a 0.4B model on an 80 GB GPU: predicted to fit, so the OOM row costs error
    big = replace(BASE, framework_overhead_gib=200.0)  # predicted not to fit: no error
    assert memory_loss([run], small) > 0.5
    assert memory_loss([run], big) == 0.0
    assert np.isfinite(memory_loss([run], small))


def test_small_tp_messages_reach_less_bandwidth():
    # tp_comm scales by (1 + M_half / M) with M = b*S*D*2 bytes: at b=1, D=4096 M = 16 MiB.
    half = 16 * 2**20 * 1.0
    tr = TrainingSpec(seq_len=2048, global_batch=1)
    base = layer_cost(gpt(), CLUSTER, tr, _plans(8, 1), BASE)
    slow = layer_cost(gpt(), CLUSTER, tr, _plans(8, 1), replace(BASE, comm_half_message_bytes=half))
    assert slow.fwd_comm_total_s[0] == pytest.approx(2.0 * base.fwd_comm_total_s[0])
