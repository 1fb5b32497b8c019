"""Hugging Face config.json files (real published values, tests/fixtures/hf/) give the same
architecture and parameter count as meshplan's presets.

Known published totals, checked by hand against the formula in ModelSpec.num_params:
GPT-2 small 124,439,808 (tied head); BERT-large 335M with pooler and MLM head; Llama-3-8B
8,030,261,248; Mistral-7B 7,241,732,096; Mixtral-8x7B 46,702,792,704.
"""

import json
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.spec.hf import load_hf_config
from meshplan.spec.presets import model_preset, resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
PUBLISHED = {
    "gpt2": 124_439_808,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name", ["llama3-8b", "mistral-7b", "qwen2.5-7b", "mixtral-8x7b", "gpt2", "bert-large"])
def test_config_json_matches_preset(name):
    spec = resolve_model(str(FIXTURES / name / "config.json"))
    preset = model_preset(name)
    assert spec.num_params() == preset.num_params()
    assert spec.num_params(active_only=True) == preset.num_params(active_only=True)
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size",
                  "vocab_size", "gated_mlp", "tied_embeddings", "arch", "norm", "position",
                  "moe_num_experts", "moe_top_k"):
        assert getattr(spec, field) == getattr(preset, field), field
    if name in PUBLISHED:
        assert spec.num_params() == PUBLISHED[name]


def test_folder_path_and_name():
    spec = resolve_model(str(FIXTURES / "mistral-7b"))
    assert spec.name == "mistralai/Mistral-7B-v0.1"


def test_unknown_model_type(tmp_path):
    cfg = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    cfg["model_type"] = "t5"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MeshplanError, match="model_type 't5' is not supported"):
        load_hf_config(tmp_path / "config.json")


def test_missing_field(tmp_path):
    cfg = json.loads((FIXTURES / "llama3-8b" / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MeshplanError, match="no num_hidden_layers"):
        load_hf_config(tmp_path / "config.json")


NEW_LAYOUTS = ["deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "gpt-oss-20b",
               "nemotron-3-nano", "nemotron-3-super"]


@pytest.mark.parametrize("name", NEW_LAYOUTS)
def test_2026_layouts_match_their_preset(name):
    """deepseek_v3, kimi_k2, qwen3_moe, gpt_oss and nemotron_h configs (published values, trimmed)."""
    spec = resolve_model(str(FIXTURES / name / "config.json"))
    preset = model_preset(name)
    got, want = spec.to_dict(), preset.to_dict()
    for key in ("name", "max_position"):
        got.pop(key), want.pop(key)
    assert got == want
    assert spec.num_params() == preset.num_params()


def _write(tmp_path, name, **changes):
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "config.json"


def test_nemotron_layers_block_type_is_read_like_the_pattern(tmp_path):
    blocks = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    pattern = model_preset("nemotron-3-nano").hybrid_pattern
    path = _write(tmp_path, "nemotron-3-nano", hybrid_override_pattern=None,
                  layers_block_type=[blocks[c] for c in pattern])
    assert load_hf_config(path).hybrid_pattern == pattern


@pytest.mark.parametrize("name,changes,match", [
    ("nemotron-3-nano", {"layers_block_type": ["mamba", "cross"], "hybrid_override_pattern": None}, "'cross'"),
    ("nemotron-3-nano", {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "M*"}, "MTP module"),
    ("nemotron-3-nano", {"hybrid_override_pattern": None}, "no hybrid_override_pattern"),
    ("nemotron-3-nano", {"hybrid_override_pattern": "MEX"}, "letter"),
    ("deepseek-v3", {"kv_lora_rank": None}, "no kv_lora_rank"),
    ("gpt-oss-20b", {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"] * 8},
     "not a periodic"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [0]}, "mlp_only_layers"),
])
def test_bad_2026_configs_name_the_problem(tmp_path, name, changes, match):
    with pytest.raises(MeshplanError, match=match):
        load_hf_config(_write(tmp_path, name, **changes))


def test_qwen3_dense_reads_qk_norm():
    # Qwen3-8B model card: 8.2B parameters, 6.95B without embeddings (input and output tables).
    spec = load_hf_config(FIXTURES / "qwen3-8b" / "config.json")
    assert spec.qk_norm and spec.head_dim == 128
    assert spec.num_params() / 1e9 == pytest.approx(8.19, rel=0.01)
    non_embedding = spec.num_params() - 2 * spec.vocab_size * spec.hidden_size
    assert non_embedding / 1e9 == pytest.approx(6.95, rel=0.01)
