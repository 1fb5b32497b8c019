"""Hugging Face weights in one process: every mapped family gives transformers' logits, unmapped or
missing tensors and unsupported numerics are refused in one line, export inverts the import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.hf_names import family_of, name_map, rope_row  # noqa: E402
from meshplan.runtime.hf_export import hf_config, to_hf_tensors, write_hf_dir  # noqa: E402
from meshplan.runtime.hf_weights import check_checkpoint, load_hf_weights  # noqa: E402
from meshplan.runtime.models import build_model  # noqa: E402
from meshplan.spec.hf import load_hf_config  # noqa: E402

pytestmark = pytest.mark.runtime

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=False)


def _hf_model(family: str):
    import transformers as tf

    if family == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0))
    cls, cfg = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**COMMON)),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**COMMON)),  # q/k/v biases
        "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(head_dim=8, **COMMON)),  # QK-norm
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(sliding_window=None, **COMMON)),
        "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=None, **COMMON)),
    }[family]
    return cls(cfg)


def _save(family: str, out: Path, seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = _hf_model(family).eval()  # eval: GPT-2's dropout off
    model.save_pretrained(out, **kw)
    return model


def _ours(path: Path):
    spec = load_hf_config(path)
    model = build_model(spec, "cpu")
    model.init_weights(1)
    load_hf_weights([model], path, spec)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "mixtral", "gpt2"])
def test_family_logits_match_transformers(family, tmp_path):
    theirs = _save(family, tmp_path / family, max_shard_size="30KB")  # several shards + index
    ours = _ours(tmp_path / family)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, rtol=1e-5, atol=1e-5)


def test_rope_rows_are_a_per_head_permutation():
    H = 8
    rows = [rope_row(r, H) for r in range(3 * H)]
    assert sorted(rows) == list(range(3 * H))
    assert rows[:H] == [0, 4, 1, 5, 2, 6, 3, 7]  # pair i = (i, i + H/2) in HF, (2i, 2i+1) here


def _rewrite(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_unmapped_and_missing_tensors_are_named(tmp_path):
    _save("llama", tmp_path / "m")
    spec = load_hf_config(tmp_path / "m")
    _rewrite(tmp_path / "m", lambda t: t.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(2)}))
    with pytest.raises(MeshplanError, match=r"tensor model\.layers\.0\.mlp\.extra_proj\.weight has no mapping"):
        check_checkpoint(tmp_path / "m", spec)
    _rewrite(tmp_path / "m", lambda t: (t.pop("model.layers.0.mlp.extra_proj.weight"), t.pop("model.norm.weight")))
    with pytest.raises(MeshplanError, match=r"no tensor model\.norm\.weight"):
        check_checkpoint(tmp_path / "m", spec)


@pytest.mark.parametrize("field,value,match", [("rope_theta", 500000.0, "rope_theta"),
                                               ("rms_norm_eps", 1e-6, "epsilon"),
                                               ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope_scaling")])
def test_unsupported_numerics_are_refused(tmp_path, field, value, match):
    _save("llama", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MeshplanError, match=match):
        check_checkpoint(tmp_path / "m", load_hf_config(tmp_path / "m"))


@pytest.mark.parametrize("family", ["qwen3", "mixtral", "gpt2"])
def test_export_inverts_import(family, tmp_path):
    """Our weights -> HF names/layouts -> a directory -> loaded back: identical tensors, and
    transformers reads the directory with our logits (rope permutation, fused qkv, experts)."""
    from transformers import AutoModelForCausalLM

    _save(family, tmp_path / "src")
    spec = load_hf_config(tmp_path / "src")
    model = build_model(spec, "cpu")
    model.init_weights(7)  # weights unlike the source's
    canonical = {k: v.detach() for k, v in model.state_dict().items()}
    fam = family_of(spec)
    assert fam == family
    tensors = to_hf_tensors(canonical, spec, fam)
    write_hf_dir(tensors, hf_config(spec, fam, torch.float32), tmp_path / "out", max_shard_bytes=20_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    back = _ours(tmp_path / "out")
    for k, v in back.state_dict().items():
        assert torch.equal(v, canonical[k]), k
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(x).logits, model(x), rtol=1e-5, atol=1e-5)


def test_every_canonical_parameter_is_mapped():
    for family in ("llama", "qwen3", "mixtral", "gpt2"):
        spec = load_hf_config_like(family)
        names = set(build_model(spec, "meta").state_dict())
        if spec.tied_embeddings:
            names.discard("output.weight")
        assert names == set(name_map(spec, family)), family


def load_hf_config_like(family: str):
    from meshplan.spec.hf import spec_from_hf_dict

    cfg = dict(COMMON, model_type=family)
    if family == "gpt2":
        cfg = dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=64)
    if family == "mixtral":
        cfg.update(num_local_experts=4, num_experts_per_tok=2)
    return spec_from_hf_dict(cfg, name=family)


@pytest.mark.parametrize("family", ["qwen3", "mixtral", "gpt2"])
def test_any_shard_reads_exactly_its_region(family, tmp_path):
    """What a rank reads for any block of rows/columns (heads cut in the middle, a fused q/k/v
    column range, a block of experts) equals that block of the full canonical tensor."""
    from contextlib import ExitStack

    from meshplan.runtime.hf_weights import _Reader, read_canonical, weight_files

    _save(family, tmp_path / "src")
    spec = load_hf_config(tmp_path / "src")
    model = build_model(spec, "cpu")
    model.init_weights(3)
    canonical = {k: v.detach() for k, v in model.state_dict().items()}
    fam = family_of(spec)
    write_hf_dir(to_hf_tensors(canonical, spec, fam), hf_config(spec, fam, torch.float32), tmp_path / "out",
                 max_shard_bytes=20_000)
    sources = name_map(spec, fam)
    g = torch.Generator().manual_seed(0)
    with ExitStack() as stack:
        reader = _Reader(weight_files(tmp_path / "out"), fam, stack)
        for name, full in canonical.items():
            if name not in sources:
                continue  # a tied head
            for _ in range(3):
                index = []
                for n in full.shape:
                    a = int(torch.randint(0, n, (1,), generator=g))
                    b = int(torch.randint(a + 1, n + 1, (1,), generator=g))
                    index.append(slice(a, b))
                got = read_canonical(reader, sources[name], tuple(index))
                assert torch.equal(got, full[tuple(index)]), (name, index)
