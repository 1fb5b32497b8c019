"""Cost-model memory terms the dry run found missing (docs/dryrun.md): the LM-head stage keeps the
logits of every micro-batch in flight there (GPipe: all m), an MoE layer keeps its routed copies."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost import calibration_for, estimate
from meshplan.cost.arrays import GPIPE, INTERLEAVED, ONE_F_ONE_B
from meshplan.cost.pipeline import head_microbatches_held
from meshplan.plan import ParallelDims, Plan, Schedule
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def test_head_microbatches_held() -> None:
    assert float(head_microbatches_held(8, GPIPE)) == 8.0
    assert float(head_microbatches_held(8, ONE_F_ONE_B)) == 1.0
    assert float(head_microbatches_held(8, INTERLEAVED)) == 1.0


def test_gpipe_head_stage_keeps_every_microbatch_logits() -> None:
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 4})
    training = TrainingSpec(seq_len=2048, global_batch=32)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    one_f_one_b = Plan(dims=ParallelDims(pp=2, dp_shard=4), zero=1)
    calib = calibration_for(cluster.gpu)
    # 32 sequences over dp 4: 8 micro-batches of one 2,048-token sequence; V = 128,256 (no tp).
    m, elements = 8, 2048 * 128256
    kept, transient = calib.logits_bytes_per_element, calib.loss_transient_bytes_per_element
    for plan, held in ((one_f_one_b, 1), (replace(one_f_one_b, schedule=Schedule.GPIPE), m)):
        last = estimate(model, cluster, training, plan).stages[-1].memory
        assert last.logits_bytes == elements * (kept * held + transient)


def test_moe_layer_keeps_its_routed_copies() -> None:
    """Each MoE layer keeps k routed copies of D per token twice (the experts' permuted input, the
    experts' output kept by the probability multiply): found by the dry run's attribution."""
    model = model_preset("mixtral-8x7b").with_overrides({"num_layers": 2})
    training = TrainingSpec(seq_len=1024, global_batch=16)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=3)
    calib = calibration_for(cluster.gpu)
    kept = estimate(model, cluster, training, plan, calib).stages[0].memory.activations_bytes
    none = estimate(model, cluster, training, plan, replace(calib, moe_routed_copies_kept=0.0)
                    ).stages[0].memory.activations_bytes
    # 16 sequences over dp 8: micro-batches of 1 x 1,024 tokens, one in flight; k = 2, D = 4,096,
    # 2 B elements; two layers.
    assert kept - none == 2 * 1024 * 2 * 4096 * 2 * 2.0


def test_pipeline_recv_buffers_when_preallocated() -> None:
    """torch's pipelining allocates a receive buffer per micro-batch for each stage's input (not the
    first stage) and output gradient (not the last), kept for the step."""
    from meshplan.cost.pipeline import recv_buffers_held

    # pp 4, 5 virtual stages per rank, 8 micro-batches: middle ranks 8 x 10, the ends 8 x 9; no pp: 0.
    assert [float(recv_buffers_held(r, 4, 5, 8)) for r in range(4)] == [72.0, 80.0, 80.0, 72.0]
    assert float(recv_buffers_held(0, 1, 1, 8)) == 0.0
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 4})
    training = TrainingSpec(seq_len=2048, global_batch=32)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    plan = Plan(dims=ParallelDims(pp=2, tp=2, dp_shard=2), zero=1, sp=True)
    calib = calibration_for(cluster.gpu)
    off = estimate(model, cluster, training, plan, replace(calib, pp_preallocated_recv_buffers=False))
    on = estimate(model, cluster, training, plan, replace(calib, pp_preallocated_recv_buffers=True))
    # 32 sequences over dp 2: 16 micro-batches; each buffer (1, 2048 / tp 2, 2048) in bf16; 2 ranks:
    # rank 0 receives gradients only, the last rank activations only.
    buffer = 2048 // 2 * 2048 * 2
    for rank in (0, 1):
        assert on.stages[rank].memory.other_bytes - off.stages[rank].memory.other_bytes == 16 * buffer


def test_last_stage_keeps_every_microbatch_output_when_the_stack_does() -> None:
    """torch's pipelining before ``return_outputs`` (torchtitan 2024-12) keeps each micro-batch's
    last-stage output for the step and merges them once the last backward has run
    (bench/dryrun_kept_outputs.py measures both on meshplan's runtime)."""
    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 4})
    training = TrainingSpec(seq_len=2048, global_batch=32)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    plan = Plan(dims=ParallelDims(pp=2, dp_shard=4), zero=1)
    calib = calibration_for(cluster.gpu)
    assert calib.pp_kept_output_bytes_per_element == 0.0  # meshplan's runtime: return_outputs=False
    base = estimate(model, cluster, training, plan, calib).stages
    kept_calib = replace(calib, pp_kept_output_bytes_per_element=2.0)
    kept = estimate(model, cluster, training, plan, kept_calib).stages
    # 8 micro-batches of one 2,048-token sequence, V = 128,256, bf16 outputs
    outputs = 8 * 2048 * 128256 * 2.0
    assert kept[0].memory.activations_bytes == base[0].memory.activations_bytes  # only the last stage
    acts = base[-1].memory.activations_bytes
    assert kept[-1].memory.activations_bytes == max(acts, outputs) + outputs
    assert kept[-1].memory.logits_bytes == base[-1].memory.logits_bytes + outputs
    # without pipelining the trainer's own step frees its logits: nothing kept
    flat = Plan(dims=ParallelDims(dp_shard=8), zero=1)
    assert (estimate(model, cluster, training, flat, kept_calib).stages[0].memory.activations_bytes
            == estimate(model, cluster, training, flat, calib).stages[0].memory.activations_bytes)


def test_fsdp2_backward_buffers_of_meshplans_runtime() -> None:
    """ZeRO-3 as meshplan's runtime runs FSDP2 (meshplan/fsdp_policy.py): beside the two gathered
    layers, the root unit (embedding, final norm, LM head) gathered through the backward with the
    LM head's bf16 gradient, and one layer's fp32 reduce-scatter input beside its bf16 gradients
    (4 + 2 bytes per parameter). They live once the loss's backward is over, so they add what
    exceeds the logits and loss transients. Found by the README plan's dry run (docs/dryrun.md);
    counted here by hand."""
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    training = TrainingSpec(seq_len=2048, global_batch=8)
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=3)
    calib = calibration_for(cluster.gpu)
    assert calib.fsdp_root_gathered_in_backward and calib.fsdp_reduce_scatter_bytes_per_param == 6.0
    without = replace(calib, fsdp_root_gathered_in_backward=False, fsdp_reduce_scatter_bytes_per_param=0.0)

    def extra(model):
        on = estimate(model, cluster, training, plan, calib).stages[0].memory
        off = estimate(model, cluster, training, plan, without).stages[0].memory
        return on.gathered_weight_bytes - off.gathered_weight_bytes, on.logits_bytes

    # Llama-3-8B layer: wq, wo 4096^2 each; wk, wv 4096 x 1024 each; w1, w2, w3 4096 x 14336 each;
    # two norms of 4096: 218,112,000. A 32,000 vocabulary: root = embedding and LM head 32,000 x
    # 4,096 each and the final norm, 262,148,096.
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    root = 2 * 32000 * 4096 + 4096
    assert layer == 218_112_000 and root == 262_148_096
    # The root's bf16 copy beyond the rank's 1/8 bf16 shard (the meshplan stack keeps a bf16 shard
    # beside the fp32 master: params_are_master False), the LM head's bf16 gradient (32,000 x 4,096
    # x 2 B), one layer's 4 + 2 bytes: 2,029,575,168 B; less the logits of one 2,048-token
    # micro-batch, 2,048 x 32,000 x (6 kept + 8 transient) = 917,504,000 B.
    added, logits = extra(model_preset("llama3-8b").with_overrides({"num_layers": 4, "vocab_size": 32000}))
    assert logits == 2048 * 32000 * (calib.logits_bytes_per_element + calib.loss_transient_bytes_per_element)
    assert logits == 917_504_000
    assert added == root * 2 * (1 - 1 / 8) + 32000 * 4096 * 2 + layer * 6 - logits == 1_112_071_168
    # The full 128,256 vocabulary: buffers 1,838,685,184 + 1,050,673,152 + 1,308,672,000 B against
    # logits 2,048 x 128,256 x 14 = 3,677,356,032 B: 520,674,304 B added.
    added, logits = extra(model_preset("llama3-8b").with_overrides({"num_layers": 4}))
    assert logits == 3_677_356_032
    assert added == (2 * 128256 * 4096 + 4096) * 2 * (1 - 1 / 8) + 128256 * 4096 * 2 + layer * 6 - logits
    assert added == 520_674_304


def test_meshplans_eager_ring_backward_tiles() -> None:
    """meshplan's ring attention (runtime/ring_attention.py) computes its blocks in fp32 query-row
    tiles (meshplan/ring_policy.py): one attention layer's backward holds 2 tiles of (b, N/t, 1,024,
    S/c) fp32 beside dO, dQ and the block's dQ in fp32, 4 fp32 dK / dV of its KV heads and the
    received K/V block. Found by the README plan's dry run (docs/dryrun.md); counted here by hand
    on that plan's attention (llama3-70b, tp 2, cp 2, 8,192 tokens), 2 layers, 32,000 vocabulary."""
    from meshplan.ring_policy import BACKWARD_LIVE_TILES, QUERY_CHUNK_ROWS

    cluster = resolve_cluster(gpu="h100-sxm", gpus=4)
    training = TrainingSpec(seq_len=8192, global_batch=1)
    model = model_preset("llama3-70b").with_overrides({"num_layers": 2, "vocab_size": 32000})
    calib = calibration_for(cluster.gpu)
    assert (calib.cp_ring_score_tile_rows, calib.cp_ring_backward_live_tiles) == (QUERY_CHUNK_ROWS,
                                                                                   BACKWARD_LIVE_TILES)
    without = replace(calib, cp_ring_score_tile_rows=0.0)

    def memory(plan, c):
        return estimate(model, cluster, training, plan, c).stages[0].memory

    ring = Plan(dims=ParallelDims(tp=2, cp=2), sp=True, cp_method="ring")
    on, off = memory(ring, calib), memory(ring, without)
    # 4,096 tokens a rank, 32 query heads, 4 KV heads of 128 a tp rank.
    tiles = 2 * 1 * 32 * 1024 * 4096 * 4
    queries = 3 * 4096 * 32 * 128 * 4
    kv = 4096 * 4 * 128 * (4 * 4 + 2 * 2)
    assert tiles + queries + kv == 1_317_011_456
    # The logits and loss transients, 4,096 x 16,000 x 14 B, are freed before a layer's backward: the
    # peak holds the larger of the two, so the tiles add 1,317,011,456 - 917,504,000 B.
    assert off.logits_bytes == 4096 * 16000 * 14 == 917_504_000
    assert on.activations_bytes - off.activations_bytes == 1_317_011_456 - 917_504_000
    # All-to-all CP, or a fused-kernel ring (Megatron-Core / TE): no tiles.
    a2a = Plan(dims=ParallelDims(tp=2, cp=2), sp=True, cp_method="all-to-all")
    assert memory(a2a, calib).activations_bytes == memory(a2a, without).activations_bytes
    megatron = calibration_for(cluster.gpu, stack="megatron")
    assert megatron.cp_ring_score_tile_rows == 0.0
