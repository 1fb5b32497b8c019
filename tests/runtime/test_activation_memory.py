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


def _whole_tensor_backward(a, b, g):
    """The SwiGLU backward on whole tensors (before the tiles): fp32 math, cast back."""
    a32, b32, g32 = a.float(), b.float(), g.float()
    sig = torch.sigmoid(a32)
    return (g32 * b32 * sig * (1 + a32 * (1 - sig))).to(a.dtype), (g32 * a32 * sig).to(b.dtype)


def test_swiglu_backward_tiles_are_bit_identical_and_bound_fp32(monkeypatch) -> None:
    """Row tiles of the fp32 math give the whole-tensor gradients bit for bit (uneven last tile),
    and no fp32 tensor of the backward is larger than a tile (before: (S, F) fp32 operands)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshplan.runtime.models import layers

    width, tile_rows = 96, 7
    monkeypatch.setattr(layers, "SWIGLU_BACKWARD_TILE_ELEMENTS", width * tile_rows)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 50, width, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(2))
    g = torch.randn(3, 50, width, generator=gen).to(torch.bfloat16)

    class Fp32Sizes(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    Fp32Sizes.largest = max(Fp32Sizes.largest, t.numel())
            return out

    y = swiglu(a, b)
    with Fp32Sizes():
        da, db = torch.autograd.grad(y, (a, b), g)
    want_da, want_db = _whole_tensor_backward(a.detach(), b.detach(), g)
    assert torch.equal(da, want_da) and torch.equal(db, want_db)
    assert da.dtype == db.dtype == torch.bfloat16 and da.shape == a.shape
    assert 0 < Fp32Sizes.largest <= width * tile_rows


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


def test_moe_combine_keeps_no_routed_copy() -> None:
    """The combine sums each token's k slots like index_add, and its backward keeps only indices
    (index_add would keep its (T*k, D) source)."""
    from meshplan.runtime.models.moe import combine_slots

    T, k, D = 6, 2, 4
    order = torch.argsort(torch.tensor([3, 1, 0, 2, 1, 1, 3, 0, 2, 2, 0, 3]), stable=True)
    src = torch.randn(T * k, D, dtype=torch.float64, requires_grad=True)
    want = torch.zeros(T, D, dtype=torch.float64).index_add(0, order // k, src)
    saved: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        got = combine_slots(src, order, k)
    torch.testing.assert_close(got, want)
    assert (T * k, D) not in saved and all(len(s) == 1 for s in saved)  # the slot order only


def test_expert_weights_gradient_built_once() -> None:
    """expert_mlp's backward builds the (E, D, F) weight gradient once (unbind), not one zero-filled
    whole copy per expert (indexing): no backward op allocates more than one weight's worth."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshplan.runtime.models.moe import expert_mlp

    E, D, F = 4, 8, 16
    w1, w3 = (torch.randn(E, D, F, requires_grad=True) for _ in range(2))
    w2 = torch.randn(E, F, D, requires_grad=True)
    y = expert_mlp(torch.randn(12, D), [3, 3, 3, 3], w1, w2, w3)

    class WholeWeightOutputs(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            whole = isinstance(out, torch.Tensor) and out.shape in ((E, D, F), (E, F, D))
            if whole and not func.is_view:  # a new (E, D, F) / (E, F, D) buffer
                WholeWeightOutputs.count += 1
            return out

    with WholeWeightOutputs():
        y.sum().backward()
    assert WholeWeightOutputs.count == 3  # one stacked gradient per weight tensor
