"""Golden parameter counts (published figures) and spec validation."""

import pytest

from meshplan.errors import MeshplanError
from meshplan.spec.model import ModelSpec
from meshplan.spec.presets import model_names, model_preset

# Published totals: Llama 3 model card, Llama 3.1 paper, GPT-3 paper, Mixtral paper (Jiang et al. 2024).
PUBLISHED = {
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3.1-405b": 405.9e9,
    "gpt3-175b": 175e9,
    "mixtral-8x7b": 46.7e9,
    "llama2-7b": 6.74e9,
    "llama2-70b": 68.98e9,
    "mistral-7b": 7.24e9,
    "qwen2.5-7b": 7.61e9,
    "qwen2.5-72b": 72.7e9,
    "gpt2-xl": 1.558e9,
}


@pytest.mark.parametrize("name,published", sorted(PUBLISHED.items()))
def test_parameter_count_matches_published(name, published):
    n = model_preset(name).num_params()
    assert abs(n - published) / published < 0.01, (name, n)


def test_mixtral_active_parameters():
    m = model_preset("mixtral-8x7b")
    assert abs(m.num_params(active_only=True) - 12.9e9) / 12.9e9 < 0.01


def test_llama3_8b_by_hand():
    # V*D embed + V*D head + L*(attn + mlp + 2 norms) + final norm, with D=4096, V=128256,
    # attn = D*D (q) + 2*D*1024 (k, v with 8 KV heads of 128) + D*D (o), mlp = 3*D*14336
    D, V, L, F, KV = 4096, 128256, 32, 14336, 8 * 128
    attn = 2 * D * D + 2 * D * KV
    mlp = 3 * D * F
    expected = 2 * V * D + L * (attn + mlp + 2 * D) + D
    assert model_preset("llama3-8b").num_params() == expected


def test_every_preset_builds():
    for name in model_names():
        assert model_preset(name).num_params() > 0


@pytest.mark.parametrize("bad", [
    dict(num_layers=0), dict(hidden_size=-1), dict(num_kv_heads=3), dict(norm="batchnorm"),
])
def test_invalid_model_raises(bad):
    base = dict(name="x", num_layers=2, hidden_size=64, num_heads=4, vocab_size=100)
    base.update(bad)
    with pytest.raises(MeshplanError):
        ModelSpec(**base)


def test_override_shrinks_consistently():
    m = model_preset("llama3-8b").with_overrides({"num_layers": "2", "hidden_size": "64", "num_heads": "4"})
    assert (m.num_layers, m.hidden_size, m.head_dim) == (2, 64, 16)
    assert m.num_heads % m.num_kv_heads == 0
    with pytest.raises(MeshplanError):
        model_preset("llama3-8b").with_overrides({"nope": "1"})
