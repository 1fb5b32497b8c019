"""The dry run's attribution of its peak (runtime/dryrun_tracker.py) and its model of CUDA's fused
RMSNorm (runtime/dryrun_kernels.py), on tiny models in this process (well under a second)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from meshplan.runtime.dryrun_kernels import FusedRmsNorm, use_fused_norm_kernels
from meshplan.runtime.dryrun_tracker import (
    ShardingPropagation,
    innermost_module,
    module_pattern,
    step_tracker,
)
from meshplan.runtime.models.layers import RMSNorm

MIB = 2**20


class _Mlp(nn.Module):
    """x (4, 256, 256) -> up (256 -> 1024) -> relu -> down (1024 -> 256), fp32, no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(256, 1024, bias=False)
        self.down = nn.Linear(1024, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_peak_attributed_by_module_op_and_dtype() -> None:
    model, x = _Mlp(), torch.randn(4, 256, 256)
    tracker = step_tracker(ShardingPropagation())
    tracker.track_external(model)
    with tracker:
        model(x).sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    rows = {(o.category, o.module, o.op): o for o in tracker.peak_origins()}
    # By hand, 1024 rows of 1024 fp32 = 4 MiB, of 256 = 1 MiB. The peak is in down's backward: relu's
    # output (saved for down's weight gradient and for relu's backward), the gradient of that output
    # (dy @ W_down) and relu's input gradient (threshold_backward) live at once, with both 1 MiB weights.
    assert rows["Activation", "_Mlp", "aten.relu.default"].bytes == 4 * MIB
    assert rows["Temp", "_Mlp.down", "aten.mm.default"].bytes == 4 * MIB
    assert rows["Temp", "_Mlp", "aten.threshold_backward.default"].bytes == 4 * MIB
    assert rows["Parameter", "-", "-"].bytes == 2 * MIB  # registered before the step: no op
    assert all(o.dtype in ("float32", "*") for o in rows.values())
    assert sum(o.bytes for o in tracker.peak_origins()) == peak
    assert tracker.peak_at() == "backward _Mlp"


def test_module_patterns() -> None:
    assert module_pattern("Transformer.layers.17._checkpoint_wrapped_module.feed_forward.w1") == \
        "Transformer.layers.*.feed_forward.w1"
    assert module_pattern("Transformer.layers.3") == "Transformer.layers.*"
    assert innermost_module({"Global", "T", "T.layers.2", "T.layers.2.attention"}) == "T.layers.*.attention"
    assert innermost_module({"Global"}) == "-"


def test_fused_rms_norm_matches_the_composite() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 5, 16, dtype=torch.float64)
    want = F.rms_norm(x, (16,), w, 1e-5)
    got = FusedRmsNorm.apply(x, w, 1e-5)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (x, w), dy), torch.autograd.grad(want, (x, w), dy)):
        torch.testing.assert_close(a, b)


def _saved_bytes(fn) -> int:
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with FakeTensorMode(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = torch.empty(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(64, dtype=torch.bfloat16, requires_grad=True)
        fn(x, w)
    return sum(saved)


def test_fused_rms_norm_saves_what_the_cuda_kernel_saves() -> None:
    # CUDA's _fused_rms_norm saves the bf16 input, the weight and one fp32 rstd per row:
    # 2*8*64*2 + 64*2 + 2*8*4 = 2048 + 128 + 64 bytes.
    assert _saved_bytes(lambda x, w: FusedRmsNorm.apply(x, w, 1e-5)) == 2048 + 128 + 64
    # The CPU composite keeps fp32 copies of the (2, 8, 64) input: at least 12 B per element.
    assert _saved_bytes(lambda x, w: F.rms_norm(x, (64,), w, 1e-5)) >= 12 * 2 * 8 * 64


def test_rms_norm_runs_outside_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under CUDA autocast rms_norm is on the fp32 list (an fp32 saved input and output): the
    runtime's RMSNorm computes in its input's dtype with autocast off, as fused norms do."""
    seen: list[bool] = []
    composite = F.rms_norm

    def recording(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return composite(*args, **kwargs)

    monkeypatch.setattr(F, "rms_norm", recording)
    norm = RMSNorm(64).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(torch.randn(2, 8, 64, dtype=torch.bfloat16))
    assert seen == [False] and y.dtype == torch.bfloat16


def test_dry_run_switches_every_rms_norm() -> None:
    model = nn.Sequential(RMSNorm(8), nn.Linear(8, 8), RMSNorm(8))
    assert use_fused_norm_kernels(model) == 2
    x = torch.randn(3, 8, dtype=torch.float64)
    model = model.double()
    y = model(x)
    assert y.grad_fn is not None and type(y.grad_fn).__name__.startswith("FusedRmsNorm")


def test_layer_norm_runs_outside_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshplan.runtime.models.layers import LayerNorm

    seen: list[bool] = []
    composite = F.layer_norm

    def recording(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return composite(*args, **kwargs)

    monkeypatch.setattr(F, "layer_norm", recording)
    norm = LayerNorm(64).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(torch.randn(2, 8, 64, dtype=torch.bfloat16))
    assert seen == [False] and y.dtype == torch.bfloat16
    x = torch.randn(2, 8, 64)
    torch.testing.assert_close(LayerNorm(64)(x), nn.LayerNorm(64)(x))  # same function, same parameters
