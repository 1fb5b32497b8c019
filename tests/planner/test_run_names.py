"""Published runs name GPUs, models and stacks their own way (issue 14, items 6-7): every alias
class resolves to one preset / entry (golden), a row per framework entry builds and is estimated,
and a name nothing matches is one clear line (a skip reason in a row; exit 2 for a bad file)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.calib.validate import evaluate, load_runs
from meshplan.errors import MeshplanError
from meshplan.spec.aliases import alias_key, resolve_alias
from meshplan.spec.frameworks import (
    framework_defaults,
    framework_key,
    framework_names,
    resolve_framework,
)
from meshplan.spec.gpu_names import resolve_gpu
from meshplan.spec.presets import model_names, model_preset
from meshplan.spec.row_model import row_model

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "frameworks.csv"


@pytest.mark.parametrize("name, preset", [
    # datasheet names and memory suffixes
    ("H100-SXM5-80GB", "h100-sxm"), ("H100 SXM 80 GB", "h100-sxm"), ("h100_80gb", "h100-sxm"),
    ("H100 SXM5 94GB", "h100-sxm-96gb"), ("H100 96GB HBM2e", "h100-sxm-96gb"), ("H200 SXM 141GB", "h200"),
    ("A100-SXM4-40GB", "a100-40gb"), ("a100_80gb", "a100-80gb"), ("A100 80G", "a100-80gb"),
    ("V100-SXM2-32GB", "v100-32gb"), ("B200 192GB", "b200"), ("GB200 NVL72", "gb200"),
    # vendor prefixes and system names
    ("NVIDIA A100 80GB", "a100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("AMD Instinct MI300X", "mi300x"),
    ("DGX H100", "h100-sxm"), ("HGX B200", "b200"), ("8x H100", "h100-sxm"),
    # SXM / PCIe variants
    ("H100 PCIe", "h100-pcie"), ("H100-PCIE-80GB", "h100-pcie"), ("h100 pci-e", "h100-pcie"),
    # the preset names themselves, in any case
    ("h100-sxm-96gb", "h100-sxm-96gb"), ("A100-80GB", "a100-80gb"), ("MI355X", "mi355x"),
])
def test_gpu_names_resolve_to_presets(name, preset):
    assert resolve_gpu(name).preset == preset


def test_gpu_name_that_leaves_something_out_says_how_it_was_read():
    assert resolve_gpu("H100").note == "gpu: 'H100' read as h100-sxm (form not given: SXM; memory not given: 80 GB)"
    assert resolve_gpu("NVIDIA A100 80GB").note == "gpu: 'NVIDIA A100 80GB' read as a100-80gb (form not given: SXM)"
    assert resolve_gpu("H100-SXM5-80GB").note == ""
    assert resolve_gpu("H200").note == ""  # the part's only preset: nothing was chosen


@pytest.mark.parametrize("name, message", [
    ("A100", "GPU 'A100' does not say its memory size (presets: a100-40gb, a100-80gb)"),
    ("V100", "GPU 'V100' does not say its memory size (presets: v100-32gb)"),
    ("A100 80GB PCIe", "no GPU preset matches 'A100 80GB PCIe' (presets of the a100: a100-40gb, a100-80gb)"),
    ("V100 16GB", "no GPU preset matches 'V100 16GB'"),
    ("H800", "unknown GPU 'H800'; known: v100-32gb, "),
    ("H100 NVL", "unknown GPU 'H100 NVL'"),
    ("TPU v5p", "unknown GPU 'TPU v5p'"),
])
def test_gpu_names_without_one_preset_are_refused_naming_the_candidates(name, message):
    with pytest.raises(MeshplanError) as exc:
        resolve_gpu(name)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


@given(st.permutations(["NVIDIA", "H100", "SXM5", "80GB", "HBM3"]), st.sampled_from([" ", "-", "_", " / "]))
def test_gpu_name_tokens_may_come_in_any_order(words, sep):
    assert resolve_gpu(sep.join(words)).preset == "h100-sxm"


@pytest.mark.parametrize("name, preset", [
    # Hugging Face ids (organisation, Meta- prefix, -hf / -Base / -Instruct suffixes)
    ("meta-llama/Meta-Llama-3-8B", "llama3-8b"), ("meta-llama/Llama-3.1-70B-Instruct", "llama3-70b"),
    ("meta-llama/Llama-2-7b-hf", "llama2-7b"), ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("Qwen/Qwen3-30B-A3B-Base", "qwen3-30b-a3b"), ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3"),
    # papers' and tables' spellings
    ("Llama 3.1 405B", "llama3.1-405b"), ("Llama-3-405B", "llama3.1-405b"), ("LLAMA3_70B", "llama3-70b"),
    ("llama3 8b", "llama3-8b"), ("Mixtral 8x22B", "mixtral-8x22b"), ("GPT-OSS-120B", "gpt-oss-120b"),
    ("Qwen2.5-72B", "qwen2.5-72b"), ("DeepSeekV3 (w/o MTP)", "deepseek-v3-nomtp"),
    # preset names
    ("llama3.2-1b", "llama3.2-1b"), ("kimi-k2", "kimi-k2"),
])
def test_model_names_resolve_to_presets(name, preset):
    alias = resolve_alias(name)
    assert alias is not None and alias.preset == preset and preset in model_names()


def test_model_keys_fold_separators_but_keep_names_apart():
    assert alias_key("meta-llama/Meta-Llama-3-8B-Instruct") == alias_key("LLAMA3_8B") == "llama38b"
    assert alias_key("DeepSeekV3 (w/o MTP)") != alias_key("DeepSeekV3")  # a '/' inside a name is no HF id
    assert "Llama 3.1" in resolve_alias("Llama-3.1-8B").note  # a later release of the same dimensions says so
    for dims_only in ("GPT 1.7B", "BLOOM-176B", "MPT-7B"):  # rows that keep their dimensions
        assert resolve_alias(dims_only) is None
    assert resolve_alias("GPT-3 175B").frameworks == ("megatron-core",)  # NeMo's rows only (test below)


@pytest.mark.parametrize("name, entry", [
    ("torchtitan", "torchtitan"), ("TorchTitan", "torchtitan"), ("torchtitan-v0.2.0", "torchtitan"), ("torchtitan 2025-03", "torchtitan"),
    ("Megatron-LM", "megatron-lm"), ("megatron_lm 0.9", "megatron-lm"), ("Megatron", "megatron-lm"),
    ("NeMo 2.0", "megatron-core"), ("nemo2", "megatron-core"), ("Megatron-Bridge", "megatron-core"), ("MCore", "megatron-core"),
    ("DeepSpeed", "deepspeed"), ("DeepSpeed v0.14.4", "deepspeed"),
    ("nanotron", "nanotron"), ("LLM Foundry", "llm-foundry"), ("MosaicML Composer", "llm-foundry"),
    ("Colossal-AI", "colossalai"), ("FSDP2", "pytorch-fsdp"), ("PyTorch FSDP", "pytorch-fsdp"),
    ("DDP", "pytorch-ddp"), ("PyTorch 2.4", "pytorch-ddp"), ("", "unstated"), (None, "unstated"),
])
def test_framework_names_resolve_to_one_entry(name, entry):
    assert resolve_framework(name) == entry
    fw = framework_defaults(name)
    assert fw.name == entry
    assert bool(fw.read_as) == (bool(name) and framework_key(name) != entry)  # case and '_' / ' ' are no reading


def test_every_entry_says_its_source_and_stack():
    for name in framework_names():
        fw = framework_defaults(name)
        assert len(fw.source) > 80, name
        assert fw.stack in ("meshplan", "megatron", "torchtitan", "deepspeed"), name


def test_stack_defaults_as_their_configs_set_them():
    titan = framework_defaults("torchtitan")
    assert (titan.zero, titan.precision.value, titan.fp8_recipes[0].value, titan.fused_attention, titan.stack) == \
        (3, "bf16", "tensorwise", True, "torchtitan")
    assert titan.sequence_parallel_with_tp and titan.embedding_loss_stages and titan.expert_tensor_parallel == 1
    colossal = framework_defaults("colossalai")  # HybridParallelPlugin(precision='fp16', zero_stage=0, enable_flash_attention=False)
    assert (colossal.precision.value, colossal.zero, colossal.fused_attention) == ("fp16", 0, False)
    nano = framework_defaults("nanotron")  # tp_mode ALL_REDUCE, no async TP
    assert not nano.sequence_parallel_with_tp and nano.settings["tp_overlap"] == 0.0
    assert framework_defaults("llm-foundry").architecture == "gpt"  # MPT rows come as dimensions


def test_unknown_framework_is_one_clear_line():
    with pytest.raises(MeshplanError) as exc:
        framework_defaults("maxtext")
    text = str(exc.value)
    assert text.startswith("no defaults known for framework 'maxtext'; known: colossalai, deepspeed,")
    with pytest.raises(MeshplanError, match="no defaults known for framework '2.0'"):
        framework_defaults("2.0")  # a version alone names no stack
    assert "\n" not in text


def test_a_row_per_framework_builds_and_is_estimated():
    runs, skipped = load_runs(FIXTURE)
    built = {r.row_id: r for r in runs}
    assert set(built) == {"titan", "ds", "nanotron", "foundry", "colossal", "fsdp", "ddp", "nemo", "mlm"}
    assert {r.row_id: r.stack for r in runs} == {
        "titan": "torchtitan", "ds": "deepspeed", "nanotron": "megatron", "foundry": "torchtitan",
        "colossal": "deepspeed", "fsdp": "torchtitan", "ddp": "torchtitan", "nemo": "megatron", "mlm": "megatron"}
    assert built["titan"].plan.zero == 3 and built["titan"].training.recipe.value == "tensorwise"
    assert built["ds"].plan.zero == 2 and built["ds"].cluster.gpu.name == "a100-80gb"
    assert built["foundry"].model.num_layers == 32 and built["foundry"].cluster.gpu.name == "a100-40gb"
    assert built["nemo"].plan.sp and built["nemo"].plan.zero == 1
    assert "framework: 'NeMo 2.0' read as megatron-core" in built["nemo"].assumed
    assert "gpu: 'H100' read as h100-sxm (form not given: SXM; memory not given: 80 GB)" in built["nanotron"].assumed
    report = evaluate(runs, skipped)
    assert len(report.rows) == 9
    for r in report.rows:
        assert r.predicted is not None and math.isfinite(r.predicted) and r.predicted > 0, r.row_id
    reasons = {s.row_id: s.reason for s in skipped}
    assert reasons["unknown-fw"].startswith("no defaults known for framework 'maxtext'")
    assert reasons["unknown-gpu"].startswith("unknown GPU 'H800'; known:")
    assert reasons["ambiguous-gpu"].startswith("GPU 'A100' does not say its memory size")


def test_heldout_set_builds_every_row_with_its_source():
    """bench/data/runs_heldout.csv (the generalization check, never fitted on): every row names its
    source, framework and provenance, and builds unless its model has no preset."""
    import csv

    path = ROOT / "bench" / "data" / "runs_heldout.csv"
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) > 100 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"] and r["framework"] and r["notes"] and r["reliability"] in ("high", "medium", "low"), r["id"]
    runs, skipped = load_runs(path)
    # NeMo's GPT3 / Nemotron rows name the NeMo configs' presets (model_aliases.json): none skipped
    assert not skipped and len(runs) == len(rows)
    models = {r.row_id: r.model.name for r in runs}
    assert models["nemo-b200-gpt3"] == "gpt3-175b" and models["nemo2407-gpt3-5b"] == "gpt3-5b"
    assert models["nemo2407-n8"] == "nemotron-8b" and models["nemo-gb200-n15"] == "nemotron4-15b"
    assert models["nemo-gb200-n340"] == "nemotron4-340b"


@pytest.mark.parametrize("preset, params", [
    # 12 L D^2 (1 + 13/(12 D)) + (V + S) D for a GPT with biases and tied embeddings (Kaplan et al.
    # 2020 Table 1's count): GPT-3 5B 24 x 4096 with 2048 positions, 50257 tokens
    ("gpt3-5b", 24 * (12 * 4096**2 + 13 * 4096) + (50257 + 2048) * 4096 + 2 * 4096),
    # Nemotron: no biases, GQA, squared-ReLU MLP (2 matrices), LayerNorm (2 D per norm), untied
    # embeddings: L (D (D + 2 K H) + D^2 + 2 D F + 4 D) + 2 V D + 2 D (final norm)
    ("nemotron-8b", 32 * (4096 * (4096 + 2 * 4096) + 4096**2 + 2 * 4096 * 16384 + 4 * 4096) + 2 * 256000 * 4096 + 2 * 4096),
    ("nemotron4-15b", 32 * (6144 * (6144 + 2 * 8 * 128) + 6144**2 + 2 * 6144 * 24576 + 4 * 6144) + 2 * 256000 * 6144 + 2 * 6144),
    ("nemotron4-340b", 96 * (18432 * (18432 + 2 * 8 * 192) + 18432**2 + 2 * 18432 * 73728 + 4 * 18432)
     + 2 * 256000 * 18432 + 2 * 18432),
])
def test_nemo_model_presets_have_their_published_size(preset, params):
    """The presets behind NeMo's performance-table names, counted by hand from their configs
    (NeMo GPTConfig5B, Nemotron3Config8B, Nemotron4Config15B / 340B): 5.0B, 8.5B, 15.6B, 341B."""
    assert model_preset(preset).num_params() == params


def test_an_alias_scoped_to_frameworks_leaves_other_rows_their_dimensions():
    """'GPT3-175B' of a NeMo table is NeMo's GPT-3 config; a Megatron-LM row of that name (the
    calibration set's 'GPT-3 175B', vocabulary 51200 padded) keeps the dimensions it states."""
    dims = {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "vocab_size": 51200}
    model, assumed = row_model("GPT-3 175B", dims, 2048, framework_defaults("megatron-lm"))
    assert model.vocab_size == 51200 and "GPT-style" in assumed[0]
    model, assumed = row_model("GPT3-175B", {}, 2048, framework_defaults("megatron-core"))
    assert model.name == "gpt3-175b" and "GPTConfig175B" in assumed[0]
    with pytest.raises(MeshplanError, match="vocab_size=51200 in the row, but preset gpt3-175b has 50257"):
        row_model("GPT3-175B", dims, 2048, framework_defaults("megatron-core"))



def test_gpu_alias_table_names_only_presets():
    import json
    from importlib import resources

    from meshplan.spec.cluster import gpu_names

    table = json.loads(resources.files("meshplan.spec").joinpath("presets/gpu_aliases.json").read_text())["gpus"]
    assert set(table) <= set(gpu_names())
    for preset in table:  # every preset's own name reads back as itself
        assert resolve_gpu(preset).preset == preset
