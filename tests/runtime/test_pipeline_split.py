"""The pipeline cut and the pre-launch checks, without processes.

Layer keys per stage and placement are checked by hand; the cut on the reference model keeps the
whole model's parameter names and shares nothing with the meta model it came from.
"""

from __future__ import annotations

import pytest

from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan
from meshplan.runtime.pipeline_check import check_pipeline_plan, local_stage_indices, stage_layer_keys
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import TrainingSpec

SHRINK = {"num_layers": 6, "hidden_size": 32, "vocab_size": 64}


def test_stage_layer_keys_follow_the_plan_split() -> None:
    plan = Plan(dims=ParallelDims(pp=2), schedule="interleaved-1f1b", vpp=2, stage_layers=(1, 2, 2, 1))
    assert stage_layer_keys(plan, 6) == [["0"], ["1", "2"], ["3", "4"], ["5"]]
    # looped placement: stage i on pp rank i % pp
    assert local_stage_indices(plan, 0) == [0, 2]
    assert local_stage_indices(plan, 1) == [1, 3]


def test_stage_layer_keys_even_split_when_not_given() -> None:
    plan = Plan(dims=ParallelDims(pp=4))
    assert stage_layer_keys(plan, 6) == [["0", "1"], ["2", "3"], ["4"], ["5"]]


def test_stage_layer_keys_refuse_a_split_that_does_not_cover_the_model() -> None:
    plan = Plan(dims=ParallelDims(pp=2), stage_layers=(2, 2))
    with pytest.raises(MeshplanError, match="sum to 4, the model has 6"):
        stage_layer_keys(plan, 6)


def _check(plan: Plan, global_batch: int) -> None:
    check_pipeline_plan(resolve_model("toy-llama", SHRINK), TrainingSpec(seq_len=8, global_batch=global_batch), plan)


def test_check_refuses_1f1b_with_fewer_microbatches_than_stages() -> None:
    plan = Plan(dims=ParallelDims(pp=4), micro_batch=1)
    _check(plan, global_batch=4)  # 4 micro-batches for 4 stages: fine
    with pytest.raises(MeshplanError, match="at least 4 micro-batches.*has 2"):
        _check(plan, global_batch=2)


def test_check_refuses_microbatches_not_a_multiple_of_the_rounds() -> None:
    plan = Plan(dims=ParallelDims(pp=2), schedule="zero-bubble", vpp=2, stage_layers=(1, 2, 2, 1))
    _check(plan, global_batch=6)  # 6 micro-batches = 3 rounds of 2
    with pytest.raises(MeshplanError, match="multiple of the number of rounds"):
        _check(plan, global_batch=5)  # 5 // 2 = 2 rounds, 5 % 2 != 0


def test_check_refuses_zero_bubble_with_recompute() -> None:
    plan = Plan(dims=ParallelDims(pp=2), schedule="zero-bubble", recompute="full")
    with pytest.raises(MeshplanError, match="zero-bubble with recompute"):
        _check(plan, global_batch=4)
    # recompute planned for no layer at all is fine
    _check(Plan(dims=ParallelDims(pp=2), schedule="zero-bubble", recompute="full",
                stage_layers=(3, 3), recompute_layers=(0, 0)), global_batch=4)


def test_check_ignores_plans_without_pipeline() -> None:
    _check(Plan(), global_batch=1)


@pytest.mark.runtime
def test_cut_stage_keeps_names_and_drops_the_ends() -> None:
    pytest.importorskip("torch")
    from meshplan.runtime.models import build_model
    from meshplan.runtime.pipeline import cut_stage, has_tied_embeddings

    meta = build_model(resolve_model("toy-gpt", SHRINK), "meta")
    assert has_tied_embeddings(meta)
    first = cut_stage(meta, ["0", "1"], is_first=True, is_last=False)
    middle = cut_stage(meta, ["2", "3"], is_first=False, is_last=False)
    last = cut_stage(meta, ["4", "5"], is_first=False, is_last=True)
    assert list(first.layers.keys()) == ["0", "1"] and list(last.layers.keys()) == ["4", "5"]
    assert first.tok_embeddings is not None and first.pos_embeddings is not None
    assert first.norm is None and first.output is None
    assert middle.tok_embeddings is None and middle.pos_embeddings is None and middle.output is None
    assert last.tok_embeddings is None and last.norm is not None
    # the last stage keeps the tied matrix as its own output.weight
    assert [n for n, _ in last.named_parameters()][-1] == "output.weight"
    names = {n for m in (first, middle, last) for n, _ in m.named_parameters()}
    assert names | {"tok_embeddings.weight"} == {n for n, _ in meta.named_parameters()} | {"output.weight"}
    # deep copies: cutting did not touch the meta model
    assert len(meta.layers) == 6 and meta.tok_embeddings is not None
