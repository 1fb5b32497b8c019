"""What the model's layers keep for backward: SwiGLU keeps its two inputs (not silu's output too),
GQA attention keeps K/V at their own head count (not expanded to the query heads)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.runtime.models.layers import CoreAttention, swiglu  # noqa: E402

pytestmark = pytest.mark.runtime


def _saved(fn, *args) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved: list = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fn(*args)
    storages = {id(t.untyped_storage()): t for t in saved}  # views of one tensor count once
    return sorted((tuple(t.shape), t.dtype) for t in storages.values())


def test_swiglu_gradient_and_saved_tensors() -> None:
    a, b = (torch.randn(5, 7, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(swiglu, (a, b))
    assert torch.allclose(swiglu(a, b), torch.nn.functional.silu(a) * b)
    assert _saved(swiglu, a, b) == [((5, 7), torch.float64)] * 2


def test_gqa_attention_keeps_kv_heads() -> None:
    B, S, Nq, Nk, H = 1, 32, 8, 2, 16
    q = torch.randn(B, S, Nq, H, requires_grad=True)
    k, v = (torch.randn(B, S, Nk, H, requires_grad=True) for _ in range(2))
    core = CoreAttention(rope=False)
    out = core(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k.repeat_interleave(Nq // Nk, 2), v.repeat_interleave(Nq // Nk, 2))),
        is_causal=True).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)
    shapes = [s for s, _ in _saved(core, q, k, v)]
    assert (B, Nk, S, H) in shapes and (B, Nq, S, H) in shapes  # K/V kept at Nk heads
    assert shapes.count((B, Nq, S, H)) == 2  # q and the output, no expanded K/V
