"""The dry run's model of a GPU kernel whose CPU implementation keeps other tensors than the GPU's.

RMSNorm: on CPU, ``F.rms_norm`` is a composite of elementwise ops whose autograd graph saves two fp32
copies of the (B, S, D) input and the fp32 normalised input (12 B per element); CUDA's fused kernel
(``aten::_fused_rms_norm``, backward ``_fused_rms_norm_backward``: torch's derivatives.yaml) saves the
input in its own dtype, the weight and one fp32 ``rstd`` per row. A dry run measures what a GPU would
hold, so ``use_fused_norm_kernels`` runs every RMSNorm of a dry-run model through ``FusedRmsNorm``,
which computes the same function and saves what the fused kernel saves. Named in docs/dryrun.md
(reference path ``fused-norm-kernel``).
"""

from __future__ import annotations

import types

import torch
from torch import nn


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The kernel's arithmetic dtype: fp32 for 16-bit inputs, the input's own otherwise."""
    return torch.promote_types(dtype, torch.float32)


class FusedRmsNorm(torch.autograd.Function):
    """y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) over the last dim (Zhang and Sennrich
    2019), computed in fp32 (fp64 for fp64 input), returned in x's dtype; saves (x, w, rstd) as CUDA's fused kernel does.

    Backward (xhat = x * rstd, g = dy * w): dx = rstd * (g - xhat * mean(g * xhat)), dw = sum(dy * xhat)
    over the rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_opmath(x.dtype))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) fp32: one value per row
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.to(xf.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        dyf = dy.to(rstd.dtype)
        g = dyf * weight.to(rstd.dtype)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (dyf * xhat).sum(dim=tuple(range(x.dim() - 1)))
        return dx.to(x.dtype), dw.to(weight.dtype), None


def _fused_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(x.device.type, enabled=False):  # as RMSNorm.forward: the input's dtype
        return FusedRmsNorm.apply(x, self.weight.to(x.dtype), self.eps)


def use_fused_norm_kernels(model: nn.Module) -> int:
    """Run every RMSNorm of ``model`` through FusedRmsNorm; returns how many were switched."""
    n = 0
    for module in model.modules():
        if type(module).__name__ == "RMSNorm":
            module.forward = types.MethodType(_fused_forward, module)
            n += 1
    return n
