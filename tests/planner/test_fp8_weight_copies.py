"""The fp8 weight copies Transformer Engine keeps, by recipe and GPU, and the recipe a
Megatron-Bridge preset runs (issue 14 item 5): tensor-scaled fp8 on Blackwell keeps no transpose
(TE quantizer.cpp@ad3f651), and a preset named ``_FP8_CS_`` runs current scaling. Worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.calib.recipe_overlay import preset_fp8_recipe
from meshplan.calib.recipes import BridgeRecipe
from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost import estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.precision import gathered_bytes_per_param, weight_copy_bytes_per_param
from meshplan.data.published import runs_csv
from meshplan.spec.cluster import gpu_preset
from meshplan.spec.training import Recipe, TrainingSpec

GB200, H100 = gpu_preset("gb200"), gpu_preset("h100-sxm")


def _fp8(recipe: Recipe) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch=64, precision="fp8", recipe=recipe)


@pytest.mark.parametrize("recipe, gpu, copies", [
    (Recipe.TENSORWISE, GB200, 1.0),  # row-wise data only: Blackwell's fp8 GEMMs take any layout
    (Recipe.DELAYED, GB200, 1.0),
    (Recipe.TENSORWISE, H100, 2.0),  # Hopper: row-wise data and its transpose
    (Recipe.MXFP8, GB200, 2.0),  # row- and column-wise MXFP8 data (the field's 2.0)
])
def test_weight_copies_by_recipe_and_gpu(recipe, gpu, copies):
    assert weight_copy_bytes_per_param(_fp8(recipe), Calibration(), gpu) == copies


def test_zero3_gathers_the_fp8_copies_of_fp8_primary_weights():
    param_gather = Calibration().replace_fields(fp8_param_gather=True)
    assert gathered_bytes_per_param(_fp8(Recipe.TENSORWISE), param_gather, GB200) == 1.0
    assert gathered_bytes_per_param(_fp8(Recipe.MXFP8), param_gather, GB200) == 2.0
    # without fp8 primary weights ZeRO-3 gathers the bf16 working weights
    assert gathered_bytes_per_param(_fp8(Recipe.TENSORWISE), Calibration(), GB200) == 2.0


def _preset(config: str) -> BridgeRecipe:
    return BridgeRecipe(**{**{f: None for f in BridgeRecipe.__dataclass_fields__}, "config": config})


@pytest.mark.parametrize("config, recipe", [
    ("LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", Recipe.TENSORWISE),
    ("GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V1", Recipe.MXFP8),
    ("QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_CS_V1/FP8_MX_V1", None),  # one layout, both recipes
    ("LLAMA3_70B_PRETRAIN_CONFIG_GB200_BF16_V1", None),
])
def test_the_presets_fp8_recipe(config, recipe):
    assert preset_fp8_recipe(_preset(config)) is recipe


def test_row_445_runs_current_scaling_and_fits():
    """Llama 3 70B on 64 GB200, Megatron FSDP, fp8 primary weights (LLAMA3_70B_..._FP8_CS_V2)."""
    runs, _ = load_runs(runs_csv("megatron-bridge"))
    run = next(r for r in runs if r.row_id == "445")
    assert run.training.recipe == Recipe.TENSORWISE
    calib = setting_calibration(run, None, {**run.settings, **run.release_values}, None)
    cs = estimate(run.model, run.cluster, run.training, run.plan, calib)
    mx = estimate(run.model, run.cluster, replace(run.training, recipe=Recipe.MXFP8), run.plan, calib)
    D, K, F = 8192, 1024, 28672  # Llama 3 70B: hidden, 8 KV heads x 128, FFN
    layer_params = 2 * D * D + 2 * D * K + 3 * D * F + 2 * D  # q, o; k, v; gate, up, down; two norms
    cs_mem, mx_mem = cs.stages[0].memory, mx.stages[0].memory
    # the 80 layers' fp8 weights, sharded 64 ways: 1 byte per parameter, not 2
    assert mx_mem.parameters_bytes - cs_mem.parameters_bytes == pytest.approx(80 * layer_params / 64)
    # FSDP's two gathered layers in fp8 (less the rank's own shard)
    assert mx_mem.gathered_weight_bytes - cs_mem.gathered_weight_bytes == pytest.approx(
        2 * layer_params * (1 - 1 / 64))
    assert cs.fits and not mx.fits
