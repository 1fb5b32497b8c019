"""Reference models, data sharding and init in one process (no process group): fast checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from meshplan.runtime.data import BatchSource, encode_bytes, local_microbatches
from meshplan.runtime.models import build_model
from meshplan.runtime.models.layers import apply_rope
from meshplan.spec.presets import model_preset

pytestmark = pytest.mark.runtime


def _model(name: str, **over):
    m = build_model(model_preset(name).with_overrides(over) if over else model_preset(name))
    m.init_device = "cpu"
    m.init_weights(0)
    return m


@pytest.mark.parametrize("name", ["toy-llama", "toy-gpt", "toy-moe", "llama3-8b", "mixtral-8x7b", "gpt2",
                                  "toy-mla", "deepseek-v3-nomtp", "kimi-k2", "qwen3-30b-a3b"])
def test_parameter_count_matches_the_planner(name):
    spec = model_preset(name)
    model = build_model(spec)  # meta device: no memory
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()


def test_tied_embeddings_stay_tied_after_materialisation():
    m = _model("toy-gpt")
    assert m.output.weight is m.tok_embeddings.weight
    assert not m.output.weight.is_meta


def test_init_is_deterministic_and_seed_dependent():
    a, b, c = _model("toy-llama"), _model("toy-llama"), build_model(model_preset("toy-llama"))
    c.init_device = "cpu"
    c.init_weights(1)
    wa, wb, wc = (m.layers["0"].attention.wq.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert abs(wa.std().item() - 0.02) < 0.003
    assert torch.equal(a.layers["0"].attention_norm.weight, torch.ones(64))


@pytest.mark.parametrize("name", ["toy-llama", "toy-gpt", "toy-moe", "toy-mla"])
def test_causal(name):
    """Changing token t leaves the logits before t unchanged and changes those from t on."""
    m = _model(name)
    x = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, 7] = (y[0, 7] + 1) % 256
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_attention_matches_a_naive_gqa_implementation():
    m = _model("toy-llama")  # 4 query heads, 2 KV heads, head dim 16
    att = m.layers["0"].attention
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    B, S, H = 2, 10, 16
    q = att.wq(x).view(B, S, 4, H)
    k = att.wk(x).view(B, S, 2, H)
    v = att.wv(x).view(B, S, 2, H)
    pos = torch.arange(S)
    q, k = apply_rope(q, pos), apply_rope(k, pos)
    out = torch.empty(B, S, 4, H)
    for h in range(4):
        kv = h // 2  # query heads 0,1 share KV head 0
        scores = q[:, :, h] @ k[:, :, kv].transpose(1, 2) / math.sqrt(H)  # (B, S, S)
        scores = scores.masked_fill(torch.ones(S, S).triu(1).bool(), float("-inf"))
        out[:, :, h] = scores.softmax(-1) @ v[:, :, kv]
    with torch.no_grad():
        assert torch.allclose(att(x), att.wo(out.flatten(2)), atol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return (apply_rope(q, torch.tensor([i])) * apply_rope(k, torch.tensor([j]))).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_moe_matches_a_per_token_loop():
    m = _model("toy-moe")
    moe = m.layers["1"].moe
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(2))
    flat = x.reshape(10, 64)
    probs_top, idx = moe.router(flat).topk(2, dim=-1)
    weights = probs_top.softmax(-1)
    ex = moe.experts
    expected = torch.zeros(10, 64)
    for t in range(10):
        for j in range(2):
            e = idx[t, j]
            h = F.silu(flat[t] @ ex.w1[e]) * (flat[t] @ ex.w3[e])
            expected[t] += weights[t, j] * (h @ ex.w2[e])
    with torch.no_grad():
        assert torch.allclose(moe(x).reshape(10, 64), expected, atol=1e-5)


def test_local_microbatches_partition_the_global_batch():
    src = BatchSource(seq_len=8, global_batch=8, vocab_size=256, seed=3)
    x, y = src.batch(1)
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    pieces = {}
    for dp_rank in range(2):
        for cp_rank in range(2):
            mbs = local_microbatches(x, y, dp_rank=dp_rank, dp=2, micro_batch=2, cp_rank=cp_rank, cp=2)
            assert len(mbs) == 2 and all(mb[0].shape == (2, 4) for mb in mbs)
            pieces[(dp_rank, cp_rank)] = torch.cat([mb[0] for mb in mbs])
    rebuilt = torch.cat([torch.cat([pieces[(d, 0)], pieces[(d, 1)]], dim=1) for d in range(2)])
    assert torch.equal(rebuilt, x)
    assert not torch.equal(src.batch(1)[0], src.batch(2)[0])


def test_text_batches_are_windows_of_the_bytes():
    text = encode_bytes("hello world, " * 20)
    src = BatchSource(seq_len=6, global_batch=3, vocab_size=256, seed=0, text=text)
    x, y = src.batch(1)
    s = bytes(x[0].tolist()).decode() + chr(y[0, -1].item())
    assert s in "hello world, " * 20
