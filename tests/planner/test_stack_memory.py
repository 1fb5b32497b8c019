"""Memory as each stack holds it (issue 14, item 5): recompute policies, FSDP with pipelining,
fp8 storage, by hand on Llama-3-8B (D 4096, 32 heads of 128, 8 KV heads, F 14336)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import STACK_FIELDS, Calibration, calibration_for
from meshplan.cost.layer import layer_cost
from meshplan.cost.op_recompute import op_selective
from meshplan.plan import ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.cluster import system_preset
from meshplan.spec.layers import layer_kind_counts
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

H100 = system_preset("dgx-h100", 2)
MODEL = model_preset("llama3-8b")
D, F, KV, HEADS = 4096, 14336, 1024, 32
SEQ = 4096
MEGATRON = Calibration().replace_fields(dropout=False)
OP_SAC = MEGATRON.replace_fields(op_selective_recompute=True)


def _train(precision="bf16"):
    return TrainingSpec(seq_len=SEQ, global_batch=64, precision=precision)


def _layer(plan, calib, precision="bf16"):
    arrays = PlanArrays.from_plans([plan.with_defaults(MODEL)])
    return layer_cost(MODEL, H100, _train(precision), arrays, calib)


def test_model_is_the_one_counted_by_hand():
    assert (MODEL.hidden_size, MODEL.ffn_hidden_size, MODEL.num_heads, MODEL.num_kv_heads * MODEL.head_dim) == (
        D, F, HEADS, KV)
    assert MODEL.gated_mlp


def test_megatron_selective_keeps_all_but_the_scores():
    """Korthikanti et al. 2022 Sec. 5 for a Llama layer, bf16, no dropout, tp 1, per token:
    attention: norm input 2D, QKV input 2D, Q 2D, K and V 2 x 2 x 1024, core output 2D;
    MLP: norm input 2D, w1/w3 input 2D, gate and up 2 x 2F, product (w2 input) 2F. = 34 D."""
    lc = _layer(Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=1, recompute=Recompute.SELECTIVE), MEGATRON)
    per_token = 2 * D + 2 * D + 2 * D + 2 * 2 * KV + 2 * D + 2 * D + 2 * D + 2 * 2 * F + 2 * F
    assert per_token == 34 * D
    assert lc.act_selective_bytes[0] == pytest.approx(SEQ * per_token)


def test_op_level_selective_keeps_input_odd_mms_and_the_attention_kernel():
    """torchtitan's op SAC on the same layer: mm order wq(1) wk(2) wv(3) wo(4) w1(5) w3(6) w2(7);
    saved: the block input 2D, wq 2D, wv 2 x 1024, the kernel's output 2D + fp32 LSE 4 x 32 heads,
    w1 2F, w2 2D. = 63616 B per token, 46.7% of Megatron's selective."""
    lc = _layer(Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=1, recompute=Recompute.SELECTIVE), OP_SAC)
    per_token = 2 * D + 2 * D + 2 * KV + (2 * D + 4 * HEADS) + 2 * F + 2 * D
    assert per_token == 63616
    assert lc.act_selective_bytes[0] == pytest.approx(SEQ * per_token)
    # the other policies do not depend on the stack's selective policy
    meg = _layer(Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=1, recompute=Recompute.SELECTIVE), MEGATRON)
    assert lc.act_none_bytes[0] == meg.act_none_bytes[0]
    assert lc.act_full_bytes[0] == meg.act_full_bytes[0]


def test_op_level_selective_with_tensor_and_sequence_parallel():
    """tp 2 with SP, micro-batch 2: tp-sharded mms see all 2S tokens and write width/2; wo and w2
    write 2S x D partial sums, each reduce-scattered to S x D (both saved: the RS is in the list);
    the block input is the sequence shard S x D. wo is the 4th mm (recomputed), w2 the 7th (saved)."""
    T = 2 * SEQ
    lc = _layer(Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=3, sp=True, micro_batch=2,
                     recompute=Recompute.SELECTIVE), OP_SAC)
    heads = HEADS // 2
    expected = (T / 2 * D * 2                      # block input (sequence shard)
                + T * (D / 2) * 2 + T * (KV / 2) * 2  # wq, wv
                + T * heads * (128 * 2 + 4)         # kernel output + LSE
                + T * (F / 2) * 2 + T * D * 2       # w1, w2 (partial sums)
                + 2 * (T / 2) * D * 2)              # reduce-scatter outputs of wo and w2
    assert lc.act_selective_bytes[0] == pytest.approx(expected)


def test_op_level_selective_saves_bf16_mm_outputs_under_fp8():
    """torchao's Float8 linears: the policy saves the mm's bf16 output, so fp8 keeps what bf16 keeps."""
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=1, recompute=Recompute.SELECTIVE)
    assert _layer(plan, OP_SAC, "fp8").act_selective_bytes[0] == _layer(plan, OP_SAC).act_selective_bytes[0]


def test_stacks_hold_memory_as_their_runtimes_do():
    tt = calibration_for(H100.gpu, "torchtitan")
    mp = calibration_for(H100.gpu, "meshplan")
    meg = calibration_for(H100.gpu, "megatron")
    assert tt.op_selective_recompute and tt.fsdp_pp_keeps_unsharded and tt.fsdp_pp_accumulates_unsharded_grads
    # meshplan's runtime checkpoints the attention core (runtime/parallelize.py apply_ac) and
    # reshards every micro-batch under PP (runtime/pipeline.py ZeroStage); fp8 runs bf16 there
    assert not mp.op_selective_recompute and not mp.fsdp_pp_keeps_unsharded
    assert not mp.fsdp_pp_accumulates_unsharded_grads
    assert mp.fp8_weight_copy_bytes_per_param == 0.0 and mp.fp8_saved_input_bytes_per_element == 2.0
    assert not meg.op_selective_recompute and meg.fp8_weight_copy_bytes_per_param == 2.0
    for f in ("op_selective_recompute", "fsdp_pp_keeps_unsharded", "fsdp_pp_accumulates_unsharded_grads",
              "zero_bubble_keeps_unsharded",
              "fp8_weight_copy_bytes_per_param", "fp8_saved_input_bytes_per_element", "logits_bytes_per_element"):
        assert f in STACK_FIELDS


def test_fsdp_with_pipelining_holds_the_stage_gradients_unsharded():
    """zero 3, pp 4 (8 layers a stage), dp_shard 4: torch's PipelineStage accumulates fp32 gradients
    unsharded until the last backward: the stage's gradients are 4 B x its parameters, not a quarter."""
    plan = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1)
    base = MEGATRON.replace_fields(fsdp_pp_accumulates_unsharded_grads=False)
    keep = estimate(MODEL, H100, _train(), plan, base.replace_fields(fsdp_pp_accumulates_unsharded_grads=True))
    shard = estimate(MODEL, H100, _train(), plan, base)
    for k, s in zip(keep.stages, shard.stages):
        assert k.memory.gradients_bytes == pytest.approx(4.0 * s.memory.gradients_bytes)
    # without pipelining FSDP reduce-scatters every micro-batch: sharded gradients either way
    flat = Plan(dims=ParallelDims(dp_shard=16), zero=3, micro_batch=1)
    a = estimate(MODEL, H100, _train(), flat, base.replace_fields(fsdp_pp_accumulates_unsharded_grads=True))
    b = estimate(MODEL, H100, _train(), flat, base)
    assert a.memory.gradients_bytes == b.memory.gradients_bytes


def test_meshplan_stack_keeps_only_fsdp_prefetch_under_pipelining():
    """meshplan's runtime: two layers gathered at most (the current and the prefetched one), as without PP,
    and one layer's fp32 reduce-scatter input beside its bf16 gradients (meshplan/fsdp_policy.py: 6 B);
    a middle stage has no root parameters (embedding, head) to hold."""
    plan = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1)
    mp = calibration_for(H100.gpu, "meshplan")
    est = estimate(MODEL, H100, _train(), plan, mp)
    layer_p = _layer(plan, mp).params_per_gpu[0]
    gathered = est.stages[1].memory.gathered_weight_bytes
    assert mp.fsdp_reduce_scatter_bytes_per_param == 6.0
    assert np.asarray(gathered) == pytest.approx(2 * layer_p * mp.weight_bytes_per_param * (1 - 1 / 4)
                                                 + layer_p * 6.0)


def test_op_level_selective_recomputes_the_even_mms():
    """wk and wo of the attention projections' FLOPs (1024 x 4096 + 4096 x 4096 of
    4096^2 + 2 x 1024 x 4096 + 4096^2: one half), w3 of the MLP's (one third)."""
    (kind, _), = layer_kind_counts(MODEL)
    one = np.ones(1)
    op = op_selective(MODEL, kind, tokens=SEQ * one, tokens_replicated=SEQ * one, tp=one,
                      sp=np.zeros(1, dtype=bool), ab=2.0)
    assert op.mixer_recomputed_share[0] == pytest.approx((KV * D + D * D) / (2 * D * D + 2 * KV * D))
    assert op.ffn_recomputed_share == pytest.approx(1 / 3)
    # the policy repeats more than Megatron's core-attention recompute, and less than a full forward
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=1, recompute=Recompute.SELECTIVE)
    lc, meg = _layer(plan, OP_SAC), _layer(plan, MEGATRON)
    assert meg.recompute_selective_s[0] < lc.recompute_selective_s[0] < lc.recompute_full_s[0]


def test_meshplan_zero_bubble_keeps_torchs_stage_behaviour():
    """The split backward needs the gathered weights after the input backward: meshplan's runtime
    keeps torch's PipelineStage behaviour there (stage gathered, gradients unsharded)."""
    mp = calibration_for(H100.gpu, "meshplan")
    one = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1)
    zb = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1, schedule=Schedule.ZERO_BUBBLE)
    a, b = estimate(MODEL, H100, _train(), one, mp), estimate(MODEL, H100, _train(), zb, mp)
    layer_p = _layer(one, mp).params_per_gpu[0]
    stage = b.stages[1]
    assert stage.memory.gradients_bytes == pytest.approx(4.0 * a.stages[1].memory.gradients_bytes)
    assert np.asarray(stage.memory.gathered_weight_bytes) == pytest.approx(
        stage.layers * layer_p * mp.weight_bytes_per_param * (1 - 1 / 4))


def test_interleaved_fsdp_holds_one_virtual_stage_gradients_when_its_backwards_run_as_one_group():
    """torch's pipelining reduce-scatters (frees) a stage's accumulated gradients right after that
    stage's last backward; interleaved 1F1B runs each virtual stage's backwards as one group when
    m <= p. pp 4, vpp 2, 32 layers: 4 a virtual stage, 8 a rank. By hand, a layer of Llama-3-8B is
    2 x 4096^2 (wq, wo) + 2 x 4096 x 1024 (wk, wv) + 3 x 4096 x 14336 (MLP) + 2 x 4096 (norms)
    = 218,112,000 parameters; the embedding 128256 x 4096 = 525,336,576, the head the same + 4096
    (the final norm)."""
    layer_p, embed_p = 218_112_000, 128256 * 4096
    calib = MEGATRON.replace_fields(fsdp_pp_accumulates_unsharded_grads=True)

    def grads(micro_batch, schedule=Schedule.INTERLEAVED_1F1B, vpp=2):
        plan = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=micro_batch, schedule=schedule, vpp=vpp)
        est = estimate(MODEL, H100, _train(), plan, calib)  # global batch 64 over dp 4: m = 16 / micro_batch
        return [s.memory.gradients_bytes / 4.0 for s in est.stages]  # fp32: parameters held

    assert grads(4) == pytest.approx([4 * layer_p + embed_p, 4 * layer_p, 4 * layer_p, 4 * layer_p + embed_p + 4096])
    # m = 8 > p: the second group of the last virtual stage runs after the first one's backwards began
    assert grads(2) == pytest.approx([8 * layer_p + embed_p, 8 * layer_p, 8 * layer_p, 8 * layer_p + embed_p + 4096])
    # 1F1B: one stage a rank, all of it
    assert grads(4, Schedule.ONE_F_ONE_B, 1)[1] == pytest.approx(8 * layer_p)
