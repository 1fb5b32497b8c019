"""Ring attention's block math in one process: tiled over query rows, GQA heads sharing their
un-expanded K/V block by broadcasting, forward and gradients equal to causal SDPA on expanded K/V."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import meshplan.runtime.ring_attention as ra  # noqa: E402

pytestmark = pytest.mark.runtime


@pytest.mark.parametrize("tile_rows", [3, 10, 1024])  # ragged tiles, one tile exactly, one larger
def test_one_block_matches_causal_sdpa(monkeypatch: pytest.MonkeyPatch, tile_rows: int) -> None:
    monkeypatch.setattr(ra, "QUERY_CHUNK_ROWS", tile_rows)
    monkeypatch.setattr(ra, "_ring_pass", lambda tensors, *_: tensors)  # a ring of one rank
    gen = torch.Generator().manual_seed(0)
    B, Nk, g, s, H = 2, 2, 3, 10, 8
    q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
               for shape in ((B, Nk, g, s, H), (B, Nk, s, H), (B, Nk, s, H)))
    out = ra._RingAttention.apply(q, k, v, None, 0, 1).permute(0, 2, 3, 1, 4)  # token-major -> (B, Nk, g, s, H)
    expand = lambda t: t.unsqueeze(2).expand(-1, -1, g, -1, -1)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True)
    assert (out - ref).abs().max().item() < 1e-5  # fp32 inside, float64 outside
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() < 1e-5


def test_k_v_keep_their_heads_and_dtype() -> None:
    """What travels around the ring: Nk heads in the compute dtype, not Nq heads in fp32."""
    seen: list[torch.Tensor] = []

    def ring_pass(tensors, *_):
        seen.extend(tensors)
        return tensors

    att = ra.RingAttention.__new__(ra.RingAttention)
    torch.nn.Module.__init__(att)
    att.rope, att.rope_dim, att.group, att.cp_rank, att.cp_size = False, 0, None, 0, 2
    q = torch.randn(1, 4, 8, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 4, 2, 16, dtype=torch.bfloat16)
    orig = ra._ring_pass
    ra._ring_pass = ring_pass
    try:
        out = att(q, k, k.clone())
    finally:
        ra._ring_pass = orig
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert seen and all(t.shape == (1, 2, 4, 16) and t.dtype == torch.bfloat16 for t in seen)


def test_output_is_kept_once_token_major(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output O is one tensor: the ring keeps it for backward and returns it laid out
    (B, s, Nq, H), so the output projection's input (``flatten(2)``) is a view of the same storage
    and adds no copy (before: head-major, a second O per layer; docs/dryrun.md, README plan)."""
    monkeypatch.setattr(ra, "_ring_pass", lambda tensors, *_: tensors)  # a ring of one rank
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    att = ra.RingAttention.__new__(ra.RingAttention)
    torch.nn.Module.__init__(att)
    att.rope, att.rope_dim, att.group, att.cp_rank, att.cp_size = False, 0, None, 0, 1
    q = torch.randn(2, 6, 8, 16, dtype=torch.bfloat16, requires_grad=True)  # (B, s, Nq, H)
    k, v = (torch.randn(2, 6, 2, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = att(q, k, v)
    flat = out.flatten(2)  # what Attention.forward hands wo
    assert out.shape == q.shape
    assert flat.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()  # no copy
    kept_o = [t for t in saved if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()]
    assert len(kept_o) == 1 and kept_o[0].numel() == out.numel()
    flat.float().sum().backward()  # the backward reads the kept O through its head-major view
    assert q.grad is not None and q.grad.shape == q.shape
