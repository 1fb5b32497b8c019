"""Memory as Megatron-Bridge's performance presets hold it (issue 15 "over budget"; issue 14 item 5).

Every value is derived by hand in the test from the published layout and the model's dimensions;
the mechanisms are the presets' own settings (frameworks.json, megatron-core):
* gradients in bf16: ``ddp.grad_reduce_in_fp32 = False`` in the performance scripts
  (scripts/performance/configs/llama/llama3_llm_pretrain.py@2a0d46e, set_llama3_common_configs;
  configs/qwen/qwen3_llm_pretrain.py set_qwen3_common_configs);
* fp8 primary weights: ``fp8_param_gather = True`` in bf16_with_fp8_current_scaling_mixed and
  bf16_with_mxfp8_mixed (src/megatron/bridge/training/mixed_precision.py@0509780);
* the distributed optimizer shards fp32 master + Adam moments (12 bytes) over dp x cp, the experts'
  over the expert data-parallel group (Megatron-LM theoretical_memory_usage.py: 6 + 12/dp bytes per
  parameter with fp32 gradients, 4 + 12/dp here).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.calib.validate import build_run, setting_calibration
from meshplan.cost import estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.layer import layer_cost
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import Precision, Recipe, TrainingSpec

# runs_megatron_bridge.csv row 319 (container 26.06): Llama 3.1 405B fp8 on 256 GB300,
# GBS 1536, MBS 1, tp2 pp8 vpp4 cp2 (dp 8).
ROW_319 = dict(id="319", source="Megatron-Bridge 26.06", model="LLAMA3.1_405B", num_layers="126",
               hidden_size="16384", num_heads="128", num_kv_heads="8", ffn_hidden_size="53248",
               seq_len="8192", gpu="gb300", num_gpus="256", gpus_per_node="8", global_batch_size="1536",
               micro_batch_size="1", tp="2", pp="8", dp="8", cp="2", ep="1", vpp="4", precision="fp8",
               measured_tokens_per_s_per_gpu="952", framework="megatron-core")
# row 292 (container 26.08): Qwen3-30B-A3B fp8 on 8 GB300, GBS 512, MBS 8, tp1 pp1 ep8 (dp 8).
ROW_292 = dict(id="292", source="Megatron-Bridge 26.08", model="Qwen3_30B_a3B", seq_len="4096", gpu="gb300",
               num_gpus="8", gpus_per_node="8", global_batch_size="512", micro_batch_size="8", tp="1",
               pp="1", dp="8", cp="1", ep="8", vpp="1", precision="fp8", measured_tokens_per_s_per_gpu="44544",
               framework="megatron-core")
GB300_GIB = 268.2
WITHOUT_PRESET_MEMORY = dict(grad_bytes_per_param_bf16=4.0, fp8_param_gather=False)
"""What the estimate charged before: fp32 gradient buffers and a bf16 weight beside the fp8 copies."""


def _estimate(row, **fields):
    run = build_run(row)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values, **fields})
    return estimate(run.model, run.cluster, run.training, run.plan, calib)


def test_llama31_405b_gb300_states_by_hand():
    est = _estimate(ROW_319)
    mem = est.memory
    # 126 layers over 32 virtual stages split with the embedding and the loss as a layer each
    # (Megatron-Core's only legal split here: 126 % 32 != 0, 128 % 32 == 0): 3, 4 x 30, 3. The
    # heaviest rank is rank 1, 16 layers (ranks 0 and 7 hold 15 beside the embedding / head),
    # over tp 2. Per layer: Q and O 2 x 16384^2, K and V 2 x 16384 x 1024, SwiGLU 3 x 16384 x
    # 53248 -> 3,187,671,040 (+ 2 norms of 16384, replicated).
    assert est.plan.stage_layers == (3,) + (4,) * 30 + (3,)
    layer = 2 * 16384 ** 2 + 2 * 16384 * 1024 + 3 * 16384 * 53248
    params = 16 * (layer / 2 + 2 * 16384)
    # 2 bytes each: bf16 for what is not a layer linear, the fp8 row- and column-wise copies for
    # the linears (no bf16 copy beside them); gradients bf16.
    assert mem.parameters_bytes == pytest.approx(2 * params, rel=0.01)
    assert mem.gradients_bytes == pytest.approx(mem.parameters_bytes, rel=1e-9)
    # fp32 master + Adam m, v: 12 bytes over dp x cp = 16
    assert mem.optimizer_bytes == pytest.approx(12 * params / 16, rel=0.01)
    assert mem.parameters_bytes / GIB == pytest.approx(47.5, abs=0.5)


def test_qwen3_30b_gb300_states_by_hand():
    mem = _estimate(ROW_292).memory
    D, L, V = 2048, 48, 151936
    attn = D * 4096 * 2 + 2 * D * 512  # Q and O (32 heads x 128), K and V (4 groups x 128)
    dense = L * (attn + D * 128) + 2 * V * D  # + router; untied embedding and LM head
    experts = L * 128 * 3 * D * 768 / 8  # 128 SwiGLU experts of 768, over ep 8
    assert mem.parameters_bytes == pytest.approx(2 * (dense + experts), rel=0.01)
    assert mem.gradients_bytes == pytest.approx(mem.parameters_bytes, rel=1e-9)
    # dense states over dp 8; the experts' data-parallel group is dp x tp / ep = 1
    assert mem.optimizer_bytes == pytest.approx(12 * dense / 8 + 12 * experts, rel=0.01)


def test_published_405b_config_fits_only_through_the_presets_memory_settings():
    with_presets = _estimate(ROW_319)
    without = _estimate(ROW_319, **WITHOUT_PRESET_MEMORY)
    assert with_presets.peak_memory_gib < GB300_GIB < without.peak_memory_gib
    # the difference is exactly the two mechanisms: a bf16 weight and 2 gradient bytes per parameter
    # (parameters are 2 bytes each with them, so each term halves)
    assert without.memory.parameters_bytes == pytest.approx(2 * with_presets.memory.parameters_bytes, rel=0.02)
    assert without.memory.gradients_bytes == pytest.approx(2 * with_presets.memory.gradients_bytes, rel=1e-9)
    assert without.memory.activations_bytes == with_presets.memory.activations_bytes


def test_blockwise_fp8_keeps_the_bf16_weight():
    """bf16_with_fp8_subchannel_scaling_mixed sets fp8_param_gather = False."""
    run = build_run(ROW_319)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    blockwise = replace(run.training, recipe=Recipe.BLOCKWISE)
    a = estimate(run.model, run.cluster, run.training, run.plan, calib).memory.parameters_bytes
    b = estimate(run.model, run.cluster, blockwise, run.plan, calib).memory.parameters_bytes
    assert b > 1.9 * a


def _moe_layer(precision, tp, etp, calib):
    m = ModelSpec(name="moe", num_layers=2, hidden_size=1024, num_heads=8, num_kv_heads=8,
                  ffn_hidden_size=2048, gated_mlp=True, vocab_size=32000, moe_num_experts=8,
                  moe_top_k=2, moe_ffn_hidden_size=512)
    plan = Plan(dims=ParallelDims(dp_shard=4 // tp, tp=tp, ep=4 // etp, etp=etp), sp=tp > 1, zero=1,
                micro_batch=2)
    cluster = system_preset("dgx-h100", 1).with_gpus(4)
    tr = TrainingSpec(seq_len=1024, global_batch=2 * (4 // tp), precision=precision)
    return layer_cost(m, cluster, tr, PlanArrays.from_plans([plan]), calib).act_none_bytes[0]


@pytest.mark.parametrize("precision,first_copy_bytes", [(Precision.BF16, 2.0), (Precision.FP8, 1.0)])
@pytest.mark.parametrize("tp,etp", [(1, 1), (2, 1), (2, 2)])
def test_moe_routed_copies_by_hand(precision, first_copy_bytes, tp, etp):
    """(T*k, D) copies an MoE layer keeps: the experts' fc1 input (fp8: TE's saved fp8 copy) and
    the experts' output for the combine (16 bits), over the tokens the rank routes: its T/t
    sequence-parallel shard gathered over the expert-TP group."""
    calib = Calibration(fused_attention=True, dropout=False)
    kept = _moe_layer(precision, tp, etp, calib)
    none = _moe_layer(precision, tp, etp, calib.replace_fields(moe_routed_copies_kept=0.0))
    T = 2 * 1024  # b x S tokens
    routed = T / tp * etp
    assert kept - none == pytest.approx(routed * 2 * 1024 * (first_copy_bytes + 2.0))


def test_megatron_core_keeps_one_routed_copy_by_hand():
    """Megatron-Core's TEGroupedMLP multiplies the routing probabilities inside the experts'
    activation (weighted_bias_swiglu_impl, megatron/core/transformer/moe/experts.py), so the
    combine keeps no (T*k, D) expert output: one routed copy, the fc1 input (frameworks.json
    megatron-core: moe_routed_copies_kept 1). Row 292: Qwen3-30B-A3B, mb 8 x 4096 tokens, top-8,
    D 2048, 48 layers on the one pipeline rank, one micro-batch in flight."""
    run = build_run(ROW_292)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    assert calib.moe_routed_copies_kept == 1.0
    one = _estimate(ROW_292).memory.activations_bytes
    two = _estimate(ROW_292, moe_routed_copies_kept=2.0).memory.activations_bytes
    T, k, D, L = 8 * 4096, 8, 2048, 48
    assert two - one == pytest.approx(L * T * k * D * 2.0)  # the bf16 expert output per copy
    assert (two - one) / GIB == pytest.approx(48.0)
