"""Autograd-aware collectives the runtime needs (all-to-all with uneven splits, gradient scaling)."""

from __future__ import annotations

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    """out = all_to_all(x); the gradient goes back through the transposed all-to-all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = grad.new_empty((sum(ctx.in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad, ctx.in_splits, ctx.out_splits, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
               group: dist.ProcessGroup) -> torch.Tensor:
    """Rows in_splits[j] of x go to rank j; rows out_splits[j] arrive from rank j (dim 0)."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity in forward; multiplies the gradient by ``factor`` in backward."""
    return _ScaleGrad.apply(x, factor)


class _AllReduceGrad(torch.autograd.Function):
    """Identity in forward, gradient summed over ``group`` in backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_grad(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Use ``x`` as is; its gradient becomes the sum of every rank's in ``group``."""
    return _AllReduceGrad.apply(x, group)


class _AllReduceForward(torch.autograd.Function):
    """Sum over ``group`` in forward, identity in backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def all_reduce_forward(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of every rank's ``x`` in ``group``; the gradient passes through unchanged."""
    return _AllReduceForward.apply(x, group)


class GradAllReduce(torch.nn.Module):
    """Module form of :func:`all_reduce_grad`, for the hooks model code leaves as nn.Identity."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_grad(x, self.group)
