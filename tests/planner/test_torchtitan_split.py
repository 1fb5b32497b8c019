"""torchtitan's own layer split over pipeline stages, where a run or a config names none."""

import pytest
from hypothesis import given, strategies as st

from meshplan.calib.validate import build_run
from meshplan.errors import MeshplanError
from meshplan.plan import even_split, torchtitan_split, torchtitan_split_2024

ROW_405B = dict(id="t", source="torchtitan docs/performance.md", model="Llama-3.1-405B", num_layers="126",
                hidden_size="16384", num_heads="128", num_kv_heads="8", ffn_hidden_size="53248",
                vocab_size="128256", seq_len="8192", gpu="H100", num_gpus="512", gpus_per_node="8",
                global_batch_size="256", micro_batch_size="4", tp="8", pp="8", cp="1",
                precision="bf16", measured_tokens_per_s_per_gpu="100", framework="torchtitan-compile")


def test_generate_split_points_by_hand():
    # 126 // 8 = 15 remainder 6: the first stage 15, the six middle ones 16, the last 126 - 111
    assert torchtitan_split_2024(126, 8) == (15,) + (16,) * 6 + (15,)
    # 126 // 16 = 7 remainder 14: the 14 middle stages take one more, the last 126 - 119 = 7
    assert torchtitan_split_2024(126, 16) == (7,) + (8,) * 14 + (7,)
    # 7 // 2 = 3: the last takes the remainder (no middle stage to give it to)
    assert torchtitan_split_2024(7, 2) == (3, 4)
    assert torchtitan_split_2024(32, 4) == (8, 8, 8, 8) == even_split(32, 4)
    with pytest.raises(MeshplanError, match="greater than the number of layers"):
        torchtitan_split_2024(4, 5)


def test_generate_llm_fqn_per_model_part_by_hand():
    # 32 + 2 = 34 slots over 4: 9, 9, 8, 8; the first and the last give one slot to the modules
    assert torchtitan_split(32, 4) == (8, 9, 8, 7)
    # torchtitan's docstring example: 3 layers, 2 stages, embedding and output 2 layers each
    assert torchtitan_split(3, 2, 2, 2) == (2, 1)
    assert torchtitan_split(126, 8) == torchtitan_split_2024(126, 8)
    with pytest.raises(MeshplanError, match="cannot split"):
        torchtitan_split(2, 5)  # 4 slots, 5 stages
    assert torchtitan_split(2, 4) == (0, 1, 1, 0)  # the embedding and the output alone at the ends


@given(st.integers(1, 200), st.integers(1, 64))
def test_splits_hold_every_layer_once(layers, stages):
    for split in (torchtitan_split_2024, torchtitan_split):
        try:
            counts = split(layers, stages)
        except MeshplanError:
            continue
        assert len(counts) == stages and sum(counts) == layers and min(counts) >= 0
        assert stages < 3 or min(counts[1:-1]) >= 1  # only the ends may hold the modules alone


def test_a_torchtitan_row_without_a_split_runs_torchtitans():
    run = build_run(ROW_405B)
    assert run.plan.stage_layers == (15,) + (16,) * 6 + (15,)
    assert "pipeline split: 15,16x6,15 (torchtitan-compile default)" in run.assumed
    # a stack without a split of its own keeps meshplan's even split (16 x 6, 15, 15)
    assert build_run({**ROW_405B, "framework": "pytorch-fsdp"}).plan.stage_layers == ()


def test_the_dated_torchtitan_entries_are_the_2024_12_stack():
    from meshplan.spec.frameworks import framework_defaults

    base, dated = framework_defaults("torchtitan-compile"), framework_defaults("torchtitan-compile 2024-12")
    assert dated.name == "torchtitan-compile-2024-12" and dated.stack == base.stack == "torchtitan"
    assert (base.pipeline_split, dated.pipeline_split) == ("torchtitan", "torchtitan-2024")
    # the base's calibration fields, and the kept last-stage outputs of torch's pipelining then
    assert dated.calibration == {**base.calibration, "pp_kept_output_bytes_per_element": 2.0}
    assert "pp_kept_output_bytes_per_element" not in base.calibration  # --target torchtitan: today's trainer
    # 32 layers over 4 stages: the 2024 function splits evenly, today's counts the modules
    row = {**ROW_405B, "model": "Llama-3-8B", "num_layers": "32", "hidden_size": "4096", "num_heads": "32",
           "ffn_hidden_size": "14336", "num_gpus": "32", "tp": "1", "pp": "4", "global_batch_size": "32",
           "micro_batch_size": "1"}
    assert build_run({**row, "framework": "torchtitan-compile 2024-12"}).plan.stage_layers == (8, 8, 8, 8)
    assert build_run(row).plan.stage_layers == (8, 9, 8, 7)
