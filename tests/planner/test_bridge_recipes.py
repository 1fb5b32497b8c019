"""Megatron-Bridge presets on published rows (calib/recipes.py, data/bridge_recipes.csv) and the
partial activation offload they need (Plan.offload_layers).

Golden values are read off the preset files named in each test (NVIDIA-NeMo/Megatron-Bridge,
scripts/performance/configs/..., at the commit in bridge_recipes.csv's source column)."""

from __future__ import annotations

import re

import pytest

from meshplan.calib.recipe_overlay import find_recipe
from meshplan.calib.recipes import (
    KEY_COLUMNS,
    NOT_EXPRESSED_COLUMN,
    RECIPE_COLUMNS,
    NotExpressible,
    load_recipes,
    parse_recipes,
    shipped_recipes,
)
from meshplan.calib.validate import build_run, evaluate, load_runs
from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.data.published import runs_csv
from meshplan.errors import MeshplanError
from meshplan.plan import Offload, ParallelDims, Plan, Recompute, embedding_loss_split
from meshplan.plan import RecomputeModule as M
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec
from meshplan.targets import why_not

# runs_megatron_bridge.csv row 400 (container 26.04): Llama 3 70B fp8 on 64 GB300, GBS 256, MBS 2,
# tp1 pp1 cp1, Megatron FSDP.
ROW_400 = dict(id="400", source="Megatron-Bridge 26.04", model="LLAMA3_70B", seq_len="8192", gpu="gb300",
               num_gpus="64", gpus_per_node="8", global_batch_size="256", micro_batch_size="2", tp="1",
               pp="1", dp="64", cp="1", ep="1", vpp="1", zero="3", precision="fp8",
               measured_tokens_per_s_per_gpu="3000", framework="megatron-core")
A = Offload.ACTIVATIONS


def _notes(run) -> str:
    return " | ".join(run.assumed)


# ---- golden rows -----------------------------------------------------------------------------
def test_llama3_70b_gb300_fp8_takes_the_activation_offload_of_its_preset():
    """LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2 = replace(BASE_LLAMA3_70B_CONFIG_GBS256,
    micro_batch_size=2, use_megatron_fsdp=True, cpu_offloading_num_layers=20)."""
    run = build_run(ROW_400)
    assert run.plan.offload == (A,) and run.plan.offload_layers == 20
    assert run.plan.zero == 3  # the row's own
    assert run.preset == "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2"
    assert "cpu_offloading_num_layers=20" in _notes(run)
    assert run.plan.notation() == "dp64 fsdp64 tp1 pp1 cp1 mb2 offload=activations:20"


def test_blank_zero_takes_megatron_fsdp_and_a_contradicting_zero_is_kept():
    blank = build_run({**ROW_400, "zero": ""})
    assert blank.plan.zero == 3 and blank.plan.dims.dp_shard == 64
    assert "zero: 3 (Megatron-Bridge preset LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2: use_megatron_fsdp)" in blank.assumed
    assert not any("megatron-core default" in a and a.startswith("zero") for a in blank.assumed)
    kept = build_run({**ROW_400, "zero": "1"})
    assert kept.plan.zero == 1
    assert any(a.startswith("zero: the row's 1 kept") for a in kept.assumed)
    assert kept.plan.offload_layers == 20  # the settings the row does not contradict still apply


def test_llama3_8b_h100_fp8_recomputes_the_first_5_layers():
    """LLAMA3_8B_PRETRAIN_CONFIG_H100_FP8_CS_V1 = replace(BASE_LLAMA3_8B_CONFIG (8 GPUs, GBS 128),
    context_parallel_size=1, recompute_num_layers=5): full recompute, method block."""
    row = {**ROW_400, "model": "LLAMA3_8B", "gpu": "h100-sxm", "num_gpus": "8", "global_batch_size": "128",
           "micro_batch_size": "1", "dp": "8", "zero": ""}
    run = build_run(row)
    assert run.plan.recompute == Recompute.FULL and run.plan.recompute_layers == (5,)
    assert run.plan.zero == 1  # the preset says nothing of FSDP: the framework's default
    assert "recompute: full, the first 5 layers of each stage" in _notes(run)
    said = build_run({**row, "recompute": "selective"})
    assert said.plan.recompute == Recompute.SELECTIVE and said.plan.recompute_layers == ()
    assert any(a.startswith("recompute: the row's selective kept") for a in said.assumed)


def test_block_recompute_per_virtual_stage_with_embedding_and_loss_stages():
    """LLAMA31_405B_PRETRAIN_CONFIG_GB200_NVFP4_V1: 128 GPUs, GBS 64, tp4 pp16 cp1 vpp8,
    recompute_num_layers=1: 126 layers in 128 virtual stages, the first and last holding only the
    embedding and the loss, each other stage recomputing its one layer."""
    row = {**ROW_400, "model": "LLAMA3.1_405B", "gpu": "gb200", "num_gpus": "128", "global_batch_size": "64",
           "micro_batch_size": "1", "tp": "4", "pp": "16", "dp": "2", "vpp": "8", "zero": "", "precision": "fp4"}
    run = build_run(row)
    assert run.plan.stage_layers == embedding_loss_split(126, 128)
    assert run.plan.recompute == Recompute.FULL
    assert run.plan.recompute_layers == tuple(min(1, n) for n in run.plan.stage_layers)
    assert run.plan.recompute_layers[0] == 0 and sum(run.plan.recompute_layers) == 126


def test_every_recompute_module_of_the_preset_is_applied():
    """NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1: 16 GPUs, GBS 1024, MBS 1, ep8,
    recompute_modules=["moe", "layernorm", "core_attn", "moe_act"]: selective recompute of all four
    (kept in the enum's order); the BF16 preset's ["moe", "layernorm"] recomputes no attention core."""
    row = {**ROW_400, "model": "Nemotron_3_Nano", "gpu": "h100-sxm", "num_gpus": "16", "global_batch_size": "1024",
           "micro_batch_size": "1", "dp": "16", "ep": "8", "zero": ""}
    run = build_run(row)
    assert run.plan.recompute == Recompute.SELECTIVE
    assert run.plan.recompute_modules == (M.CORE_ATTN, M.MOE, M.MOE_ACT, M.LAYERNORM)
    assert "not applied" not in _notes(run)
    assert "ckpt=sel(core_attn+moe+moe_act+layernorm):all" in run.plan.notation()
    bf16 = build_run({**row, "precision": "bf16"})
    assert bf16.plan.recompute == Recompute.SELECTIVE and bf16.preset != ""
    assert bf16.plan.recompute_modules == (M.MOE, M.LAYERNORM)
    said = build_run({**row, "precision": "bf16", "recompute": "selective"})  # the row names no modules
    assert said.plan.recompute_modules == (M.MOE, M.LAYERNORM)
    assert "recompute modules: moe+layernorm" in _notes(said)
    # the preset's modules drop activations: less memory than the attention core alone, more time
    core = build_run({**row, "precision": "bf16", "recompute": "selective", "source": "elsewhere"})
    assert core.plan.recompute_modules == ()
    calib = calibration_for(bf16.cluster.gpu, "megatron")
    est_mod = estimate(bf16.model, bf16.cluster, bf16.training, bf16.plan, calib)
    est_core = estimate(core.model, core.cluster, core.training, core.plan, calib)
    assert est_mod.memory.activations_bytes < est_core.memory.activations_bytes
    assert est_mod.step_time_s > est_core.step_time_s


@pytest.mark.parametrize("change", [dict(micro_batch_size="1", dp="64"),  # another layout: another preset
                                    dict(global_batch_size="512"),
                                    dict(source="some other benchmark")])
def test_rows_of_another_preset_or_source_take_nothing(change):
    run = build_run({**ROW_400, **change})
    assert run.plan.offload == () and run.preset == ""
    assert "Megatron-Bridge preset" not in _notes(run)


def test_evaluate_counts_the_rows_that_took_a_preset():
    rows = [build_run(ROW_400), build_run({**ROW_400, "micro_batch_size": "1"})]
    report = evaluate(rows, [])
    assert report.summary()["preset_rows"] == 1
    assert [r.preset for r in report.rows] == ["LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", ""]


# ---- the recipe file -------------------------------------------------------------------------
def test_shipped_file_names_a_preset_file_and_commit_per_row():
    recipes = shipped_recipes()
    assert len(recipes) > 50
    for r in recipes.values():
        assert re.fullmatch(r"(scripts/performance/configs/\w+|src/megatron/bridge/perf_recipes/\w+/\w+)/\w+\.py"
                            r"@[0-9a-f]{40}", r.source), r.source
        assert (r.not_expressed or r.megatron_fsdp or r.recompute_num_layers or r.recompute_modules or r.cpu_offloading_num_layers
                or r.moe_a2a_overlap is not None or r.moe_token_dispatcher_type)


GOOD = ",".join(RECIPE_COLUMNS) + "\nllama3-70b,gb300,fp8,64,256,2,1,1,1,1,1,1,,,20,CFG,path.py@abc\n"


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("cpu_offloading_num_layers,", ""), "missing column(s): cpu_offloading_num_layers"),
    (GOOD.replace(",20,", ",twenty,"), "line 2: column cpu_offloading_num_layers: 'twenty' is not a whole number"),
    (GOOD.replace(",20,", ",0,"), "line 2: column cpu_offloading_num_layers: 0 is below 1"),
    (GOOD.replace(",fp8,", ",fp9,"), "line 2: column precision: 'fp9' is not one of"),
    (GOOD.replace(",1,,,20,", ",1,,core_atn,20,"), "line 2: column recompute_modules: 'core_atn' is not one of"),
    (GOOD.replace(",1,,,20,", ",yes,,,20,"), "line 2: column megatron_fsdp: 'yes' is not 0, 1 or blank"),
    (GOOD.replace(",CFG,", ",,"), "line 2: column config is blank"),
    (GOOD + GOOD.splitlines()[1] + "\n", "line 3: repeats the key of line 2"),
])
def test_malformed_recipe_file_is_one_clear_line(text, message):
    with pytest.raises(MeshplanError) as exc:
        parse_recipes(text, "r.csv")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_recipe_file_on_disk(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text(GOOD)
    (recipe,) = load_recipes(path).values()
    assert recipe.key == ("llama3-70b", "gb300", "fp8", 64, 256, 2, 1, 1, 1, 1, 1)
    assert len(recipe.key) == len(KEY_COLUMNS)
    assert recipe.cpu_offloading_num_layers == 20 and recipe.megatron_fsdp
    with pytest.raises(MeshplanError, match="no such recipes file"):
        load_recipes(tmp_path / "none.csv")


# ---- presets meshplan cannot express ------------------------------------------------------------
# runs_megatron_bridge.csv row 302 (container 26.08): Nemotron 3 Ultra fp8 on 256 GB300, GBS 256, MBS 1,
# tp1 pp1 ep64. Its preset (nemotron_3_ultra_pretrain_256gpu_gb300_fp8mx_config, perf_recipes/
# nemotronh/gb300/nemotronh.py@007282e) offloads the expert MLP's FC1 output per MoE layer
# (fine_grained_activation_offloading, offload_modules fused_group_mlp) and shards with HSDP.
ROW_302 = dict(id="302", source="Megatron-Bridge 26.08", model="Nemotron_3_Ultra", seq_len="8192", gpu="gb300",
               num_gpus="256", gpus_per_node="8", global_batch_size="256", micro_batch_size="1", tp="1", pp="1",
               dp="256", cp="1", ep="64", vpp="1", precision="fp8", measured_tokens_per_s_per_gpu="3552",
               framework="megatron-core")


def test_a_row_of_a_preset_meshplan_cannot_express_is_skipped_with_the_setting_named():
    with pytest.raises(NotExpressible, match="fused_group_mlp.*cannot express: not estimated"):
        build_run(ROW_302)
    assert isinstance(NotExpressible("x"), MeshplanError)  # load_runs skips it, not refuses the file


def test_the_shipped_table_skips_row_302_and_its_gb200_twin():
    # 303 ran nemotron_3_ultra_pretrain_256gpu_gb200_fp8mx_config (nemotronh/gb200/nemotronh.py@76a5eb2):
    # the GB300 preset's expert-MLP offload and HSDP at tp 2, which meshplan cannot express either
    runs, skipped = load_runs(runs_csv("megatron-bridge"))
    reasons = {s.row_id: s.reason for s in skipped}
    assert "offload_modules fused_group_mlp" in reasons["302"]
    assert "offload_modules fused_group_mlp" in reasons["303"]
    assert not {"302", "303"} & {r.row_id for r in runs}


def test_not_expressed_column_is_optional_and_read():
    (recipe,) = parse_recipes(GOOD, "r.csv").values()
    assert recipe.not_expressed == ""
    text = GOOD.replace("\n", f",{NOT_EXPRESSED_COLUMN}\n", 1).rstrip("\n") + ",host offload of the moon\n"
    (recipe,) = parse_recipes(text, "r.csv").values()
    assert recipe.not_expressed == "host offload of the moon"
    row = {**ROW_400, "zero": ""}
    assert find_recipe(row, ("llama3-70b", "gb300", "fp8", 64, 256, 2, 1, 1, 1, 1, 1), parse_recipes(text, "r.csv"))


# ---- partial activation offload --------------------------------------------------------------
L70 = model_preset("llama3-70b")
H100 = system_preset("dgx-h100")
TRAIN = TrainingSpec(seq_len=8192, global_batch=32)


def _est(offload=(), calib=None, **plan):
    p = Plan(dims=ParallelDims(dp_shard=8), zero=3, recompute="full", offload=offload, **plan)
    return estimate(L70, H100, TRAIN, p, calib)


def test_offloading_n_of_the_layers_moves_n_layers_of_activations_by_hand():
    """Full recompute keeps each layer's input, b*S*D*2 bytes; offloading 20 of the 80 layers moves
    20 of them to the host and copies them down and up once per micro-batch (2 x 20 layers / rate),
    all exposed on meshplan's runtime (save_on_cpu), at the GPU's share of the node's host DRAM
    (614.4 GB/s x 0.5 / 8 = 38.4 GB/s, below the 55 GB/s PCIe link)."""
    layer_bytes = TRAIN.seq_len * L70.hidden_size * 2
    base, part = _est(), _est((A,), offload_layers=20)
    assert part.host_memory_gib * GIB == pytest.approx(20 * layer_bytes, rel=1e-9)
    assert base.memory.activations_bytes - part.memory.activations_bytes == pytest.approx(20 * layer_bytes, rel=1e-9)
    m = part.time.num_microbatches
    assert part.time.offload_s == pytest.approx(m * 2 * 20 * layer_bytes / (614.4e9 * 0.5 / 8), rel=1e-9)
    everything = _est((A,))
    assert _est((A,), offload_layers=80).host_memory_gib == pytest.approx(everything.host_memory_gib, rel=1e-12)
    assert _est((A,), offload_layers=500).peak_memory_gib == pytest.approx(everything.peak_memory_gib, rel=1e-12)


def test_megatron_offload_hides_its_copies_behind_compute():
    calib = calibration_for(H100.gpu, "megatron")
    hidden = _est((A,), calib.replace_fields(activation_offload_overlap=1.0), offload_layers=20)
    assert hidden.time.offload_s == 0.0 and hidden.time.offload_total_s > 0.0
    assert hidden.step_time_s == pytest.approx(_est((), calib).step_time_s, rel=1e-12)


def test_offload_layers_plan_rules():
    with pytest.raises(MeshplanError, match="needs offload 'activations'"):
        Plan(offload_layers=4)
    with pytest.raises(MeshplanError, match="offload_layers must be a whole number >= 0"):
        Plan(offload=(A,), offload_layers=-1)
    p = Plan(offload=(A,), offload_layers=4)
    assert Plan.from_dict(p.to_dict()) == p
    assert "offload_layers" in why_not("meshplan", L70, TRAIN, p)
    assert why_not("megatron", L70, TRAIN, p) is None
