"""Memory as DTensor's tensor parallel holds it (torchtitan; frameworks.json), by hand on a
Llama-3-8B layer (D 4096): gathered linear inputs under sequence parallel, loss parallel's
log-softmax decomposition."""

from __future__ import annotations

import pytest

from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import STACK_FIELDS, Calibration, calibration_for
from meshplan.cost.layer import layer_cost
from meshplan.plan import ParallelDims, Plan, Recompute
from meshplan.spec.cluster import gpu_preset, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

H100 = system_preset("dgx-h100", 2)
MODEL = model_preset("llama3-8b")
D, SEQ, V = 4096, 4096, 128256
TRAIN = TrainingSpec(seq_len=SEQ, global_batch=64, precision="bf16")
MEGATRON = Calibration().replace_fields(dropout=False)
DTENSOR = MEGATRON.replace_fields(sp_saves_gathered_inputs=True)
TP_SP = Plan(dims=ParallelDims(dp_shard=4, tp=4), zero=3, sp=True, micro_batch=2, recompute=Recompute.FULL)


def _layer(plan, calib):
    return layer_cost(MODEL, H100, TRAIN, PlanArrays.from_plans([plan.with_defaults(MODEL)]), calib)


def test_sequence_parallel_linears_keep_their_gathered_input():
    """tp 4 + SP, micro-batch 2 (T = 8192 tokens): Megatron keeps each sub-block's linear input as
    the sequence shard (T/4 x D) and gathers it again in the backward; DTensor keeps the gathered
    T x D. Two sub-blocks (attention, MLP), 2 bytes: 2 x (T - T/4) x D x 2 more per layer."""
    T = 2 * SEQ
    extra = 2 * (T - T / 4) * D * 2
    assert extra == 100_663_296  # 96 MiB per layer
    meg, dt = _layer(TP_SP, MEGATRON), _layer(TP_SP, DTENSOR)
    assert dt.act_none_bytes[0] - meg.act_none_bytes[0] == pytest.approx(extra)
    assert dt.act_selective_bytes[0] - meg.act_selective_bytes[0] == pytest.approx(extra)
    assert dt.act_full_bytes[0] == meg.act_full_bytes[0]  # full recompute keeps the block input only
    no_sp = Plan(dims=ParallelDims(dp_shard=4, tp=4), zero=3, sp=False, micro_batch=2, recompute=Recompute.FULL)
    assert _layer(no_sp, DTENSOR).act_none_bytes[0] == _layer(no_sp, MEGATRON).act_none_bytes[0]


def test_loss_parallel_holds_the_decomposed_log_softmax():
    """tp 4, one rank holding the head (pp 1): T x V/4 logits, 4 more fp32 bytes each at the loss
    (the shifted logits and their exp beside the input); tp 1 runs the fused kernel: nothing more."""
    T = 2 * SEQ
    calib = MEGATRON.replace_fields(loss_parallel_transient_bytes_per_element=4.0)
    base, lp = estimate(MODEL, H100, TRAIN, TP_SP, MEGATRON), estimate(MODEL, H100, TRAIN, TP_SP, calib)
    vt = 32128  # V / 4 = 32064 padded up to a multiple of 128 (Calibration.vocab_pad_multiple)
    assert MEGATRON.vocab_pad_multiple == 128
    elements = T * vt
    assert lp.memory.logits_bytes - base.memory.logits_bytes == pytest.approx(4.0 * elements)
    one = Plan(dims=ParallelDims(dp_shard=16), zero=3, micro_batch=2, recompute=Recompute.FULL)
    assert estimate(MODEL, H100, TRAIN, one, calib).memory.logits_bytes == \
        estimate(MODEL, H100, TRAIN, one, MEGATRON).memory.logits_bytes


def test_torchtitan_rows_hold_memory_as_dtensor_does():
    # the torchtitan stack's own record carries them, so `estimate --target torchtitan` and the
    # torchtitan rows of a runs file (framework -> stack) read one source
    calib = calibration_for(gpu_preset("h100-sxm"), "torchtitan")
    assert calib.sp_saves_gathered_inputs is True
    assert calib.loss_parallel_transient_bytes_per_element == 4.0
    assert calibration_for(gpu_preset("h100-sxm"), "megatron").sp_saves_gathered_inputs is False
    for f in ("sp_saves_gathered_inputs", "loss_parallel_transient_bytes_per_element"):
        assert f in STACK_FIELDS


def test_lm_head_keeps_its_gathered_input_under_sequence_parallel():
    """The output projection (ColwiseParallel from the sequence shard) saves the gathered T x D
    input: 8192 x (1 - 1/4) x 4096 x 2 bytes more on the head's rank than Megatron's shard."""
    base, dt = estimate(MODEL, H100, TRAIN, TP_SP, MEGATRON), estimate(MODEL, H100, TRAIN, TP_SP, DTENSOR)
    assert dt.memory.logits_bytes - base.memory.logits_bytes == pytest.approx(8192 * 0.75 * D * 2)
    assert 8192 * 0.75 * D * 2 == 50_331_648
