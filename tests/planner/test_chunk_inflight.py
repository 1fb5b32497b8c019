"""Interleaved 1F1B with virtual stages of different sizes (cost/chunk_inflight.py): the layers a
rank holds at its peak under Megatron-Core's order, worked by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from meshplan.calib.validate import build_run
from meshplan.cost.chunk_inflight import (chunk_weight, interleaved_warmup, layer_weighted_in_flight,
                                          plan_chunk_weight)
from meshplan.cost.arrays import INTERLEAVED
from meshplan.cost.pipeline import in_flight_chunks
from meshplan.plan import ParallelDims, Plan, Schedule

# runs_megatron_bridge.csv row 321 (container 26.06): Llama 3.1 405B fp8 on 256 GB200, GBS 1536,
# MBS 1, tp4 pp16 vpp4 (dp 4): 384 micro-batches.
ROW_321 = dict(id="321", source="Megatron-Bridge 26.06", model="LLAMA3.1_405B", num_layers="126",
               hidden_size="16384", num_heads="128", num_kv_heads="8", ffn_hidden_size="53248",
               seq_len="8192", gpu="gb200", num_gpus="256", gpus_per_node="8", global_batch_size="1536",
               micro_batch_size="1", tp="4", pp="16", dp="4", cp="1", ep="1", vpp="4", precision="fp8",
               measured_tokens_per_s_per_gpu="843", framework="megatron-core")


def test_small_schedule_by_hand():
    # p 2, v 2, 4 micro-batches, rank 0: W = 2 (2 - 0 - 1) + (2 - 1) 2 = 4 warm-up forwards.
    # Forwards run chunks 0 0 1 1 0 0 1 1 (groups of p), backwards 1 1 0 0 1 1 0 0.
    assert interleaved_warmup(0, 2, 2) == 4
    # Chunks of 1 and 3 layers. Before backward i the rank holds forwards 0..W+i less backwards 0..i-1:
    # i=0: 1+1+3+3+1 = 9; i=1: 10 - 3 = 7; i=2: 13 - 6 = 7; i=3: 16 - 7 = 9.
    assert layer_weighted_in_flight(0, 2, 2, 4, (1, 3)) == 9.0
    # the even mix: W + 1 = 5 chunk sets of (1 + 3) / 2 layers = 10
    assert chunk_weight(0, 2, 2, 4, (1, 3)) == pytest.approx(0.9)
    # the heavy chunk first: i=0: 3+3+1+1+3 = 11; i=1: 14 - 1 = 13 (a light chunk-1 backward frees
    # little while a heavy chunk-0 forward comes in); i=2: 15 - 2 = 13; i=3: 16 - 5 = 11
    assert layer_weighted_in_flight(0, 2, 2, 4, (3, 1)) == 13.0
    assert chunk_weight(0, 2, 2, 4, (3, 1)) == pytest.approx(1.3)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(2, 6), st.integers(1, 6), st.integers(1, 5), st.data())
def test_equal_chunks_hold_the_schedules_count(pp, vpp, groups, size, data):
    rank = data.draw(st.integers(0, pp - 1))
    m = groups * pp
    held = in_flight_chunks(rank, pp, vpp, m, INTERLEAVED)
    assert layer_weighted_in_flight(rank, pp, vpp, m, (size,) * vpp) == pytest.approx(float(held) * size)
    assert chunk_weight(rank, pp, vpp, m, (size,) * vpp) == pytest.approx(1.0)


def test_llama31_405b_first_rank_by_hand():
    # Megatron's split with the embedding and the loss as a layer each: 1, 2 x 62, 1 over 64
    # virtual stages. Rank 0 runs W = 2 x 15 + 3 x 16 = 78 warm-up forwards, then one more before
    # its first backward: chunk 0 for forwards 0-15 and 64-78 (31 times, 1 layer), chunks 1-3 for
    # 16-63 (48 times, 2 layers): 127 layer sets, against the even mix's 79 x 7 / 4 = 138.25.
    assert layer_weighted_in_flight(0, 16, 4, 384, (1, 2, 2, 2)) == 127.0
    assert chunk_weight(0, 16, 4, 384, (1, 2, 2, 2)) == pytest.approx(127 / 138.25)
    run = build_run(ROW_321)
    plan = run.plan.with_defaults(run.model)
    assert plan.stage_layers == (1,) + (2,) * 62 + (1,)
    assert plan_chunk_weight(plan, 0, 384) == pytest.approx(127 / 138.25)
    assert plan_chunk_weight(plan, 1, 384) == 1.0  # chunks of 2 layers each


def test_even_split_and_other_schedules_weigh_one():
    import dataclasses

    from meshplan.spec.presets import model_preset
    model = dataclasses.replace(model_preset("llama3-8b"), num_layers=30)
    even = Plan(dims=ParallelDims(pp=2), vpp=2, schedule=Schedule.INTERLEAVED_1F1B)
    filled = even.with_defaults(model)
    assert filled.stage_layers == (8, 8, 7, 7)  # meshplan's even split: rank 0 runs chunks of 8 and 7
    assert plan_chunk_weight(filled, 0, 8) == 1.0  # scored as the even mix, as the search scores it
    own = Plan(dims=ParallelDims(pp=2), vpp=2, schedule=Schedule.INTERLEAVED_1F1B, stage_layers=(4, 11, 11, 4))
    assert plan_chunk_weight(own.with_defaults(model), 0, 8) == pytest.approx(chunk_weight(0, 2, 2, 8, (4, 11)))
    assert plan_chunk_weight(own.with_defaults(model), 0, 8) != 1.0
    assert plan_chunk_weight(Plan(dims=ParallelDims(pp=2), stage_layers=(4, 26)).with_defaults(model), 0, 8) == 1.0


def test_estimate_holds_the_weighted_layers_on_the_first_rank():
    from meshplan.calib.validate import setting_calibration
    from meshplan.cost import PlanArrays, estimate
    from meshplan.cost.layer import layer_cost

    run = build_run(ROW_321)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    plan = run.plan.with_defaults(run.model)
    per_layer = layer_cost(run.model, run.cluster, run.training, PlanArrays.from_plans([plan]), calib).act_none_bytes[0]
    # no recompute, no LM head on rank 0: its activations are 127 layer sets (not 79 x 7 / 4)
    assert est.stages[0].memory.activations_bytes == pytest.approx(127 * per_layer, rel=1e-9)
    assert est.stages[1].memory.activations_bytes == pytest.approx(77 * 2 * per_layer, rel=1e-9)
