"""OSDP in the runtime (Jiang et al. 2023): FSDP2 units per operator group with their reshard
policy, each MLP in slices, and a chunked LM head with its loss.

* ``split_mlps``: each dense MLP becomes ``k`` MLPs of width F/k whose outputs add up,
  ``w2(act(w1 x) * w3 x) = sum_i w2_i(act(w1_i x) * w3_i x)`` (the hidden units are independent);
  each slice's weights are the rows (w1, w3) or columns (w2) of the whole MLP's, drawn by
  ``models.init`` as that slice of the whole tensor (``osdp_slice``), so one process and the split
  run start from the same function. Only the first slice keeps w2's bias.
* ``osdp_units``: the FSDP2 units that apply_dp wraps before each layer: a kept group gets its own
  unit with ``reshard_after_forward=False`` (gathered from forward to backward, ZeRO-2 for that
  group), each MLP slice its own unit (resharded: gathered one at a time, with FSDP2's prefetch of
  the next); what is left stays in the layer's unit and the root's, as before.
* ``ChunkedLMHead``: the LM head and cross-entropy over ``c`` chunks of the tokens, each under
  activation checkpointing, so only one chunk's logits exist at a time, in forward and in
  backward (which recomputes that chunk's logits); its weight is the same parameter
  (``output.weight``, tied to the embedding where the model ties them).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from meshplan.plan import OpGroup, Plan
from meshplan.runtime.models.layers import MLP

SLICES = "osdp_slices"
"""Name of the ModuleList holding an MLP's slices (``models.init.canonical_name`` drops it)."""


class SlicedMLP(nn.Module):
    """An MLP as ``k`` slices of its inner width; the sum of their outputs is the MLP's."""

    def __init__(self, mlp: MLP, k: int) -> None:
        super().__init__()
        dim, hidden = mlp.w1.in_features, mlp.w1.out_features
        gated, bias = mlp.w3 is not None, mlp.w1.bias is not None
        with torch.device(mlp.w1.weight.device):
            slices = [MLP(dim, hidden // k, gated, bias) for _ in range(k)]
        for i, s in enumerate(slices):
            for lin, along in ((s.w1, 0), (s.w3, 0), (s.w2, 1)):  # F is w1/w3's dim 0, w2's dim 1
                if lin is None:
                    continue
                # models.init draws the whole MLP's tensor and keeps this slice
                lin.osdp_slice = (i, k, {"weight": 0, "bias": 0} if along == 0 else {"weight": 1})
            if i > 0 and s.w2.bias is not None:
                s.w2.register_parameter("bias", None)  # the output bias is added once
        setattr(self, SLICES, nn.ModuleList(slices))

    @property
    def slices(self) -> nn.ModuleList:
        return getattr(self, SLICES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = None
        for s in self.slices:
            y = s(x)
            out = y if out is None else out + y
        return out


def split_mlps(model: nn.Module, k: int) -> None:
    """Replace every dense layer's MLP by its ``k`` slices (in place, before any parallelism)."""
    if k <= 1:
        return
    for layer in model.layers.values():
        if layer.feed_forward is not None:
            layer.feed_forward = SlicedMLP(layer.feed_forward, k)


class ChunkedLMHead(nn.Module):
    """The output projection; inside :meth:`targets` its forward returns the sum of the
    cross-entropy over the tokens instead of the logits, computed ``chunks`` tokens-chunks at a
    time under checkpointing (no (B, S, V) logits tensor, in forward or backward)."""

    def __init__(self, output: nn.Linear, chunks: int) -> None:
        super().__init__()
        self.weight = output.weight  # the same Parameter (tied embeddings stay tied)
        self.chunks = chunks
        self._targets: torch.Tensor | None = None

    @contextlib.contextmanager
    def targets(self, y: torch.Tensor) -> Iterator[None]:
        """Within: ``forward(h)`` returns the loss sum over ``y``'s tokens."""
        self._targets = y
        try:
            yield
        finally:
            self._targets = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self._targets is None:
            return F.linear(h, self.weight)
        hidden = h.flatten(0, 1)  # (B*S, D)
        y = self._targets.flatten()
        total = None
        for h_c, y_c in zip(hidden.chunk(self.chunks), y.chunk(self.chunks)):
            part = checkpoint(_chunk_loss_sum, h_c, self.weight, y_c, use_reentrant=False)
            total = part if total is None else total + part
        return total


def _chunk_loss_sum(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over one chunk's tokens: (T_c, D) @ (D, V) logits, in fp32."""
    return F.cross_entropy(F.linear(h, weight).float(), y, reduction="sum")


def chunk_head(model: nn.Module, chunks: int) -> None:
    """Replace the output projection by its chunked form (in place, before any parallelism)."""
    if chunks > 1 and model.output is not None:
        model.output = ChunkedLMHead(model.output, chunks)


def apply_osdp_modules(model: nn.Module, plan: Plan) -> None:
    """The module changes OSDP makes before parallelism: MLP slices, the chunked LM head."""
    split_mlps(model, plan.mlp_splits)
    chunk_head(model, plan.head_splits)


def osdp_units(model: nn.Module, plan: Plan) -> list[tuple[nn.Module, bool]]:
    """``(module, reshard_after_forward)`` of the FSDP2 units OSDP adds, innermost first (each
    wrapped before the layer or root that holds it). Empty below zero 3 or without OSDP."""
    if plan.zero != 3:
        return []
    kept = set(plan.keep_gathered)
    units: list[tuple[nn.Module, bool]] = []
    for layer in model.layers.values():
        if OpGroup.ATTENTION in kept:
            units.append((layer.attention, False))
        mlp = layer.feed_forward if layer.feed_forward is not None else layer.moe
        if isinstance(mlp, SlicedMLP):
            units += [(s, True) for s in mlp.slices]
        elif OpGroup.MLP in kept and mlp is not None:
            units.append((mlp, False))
    tied = (model.tok_embeddings is not None and model.output is not None
            and model.output.weight is model.tok_embeddings.weight)
    if not tied:  # a tied table stays in the root unit, which FSDP2 keeps gathered after forward
        if OpGroup.EMBEDDING in kept and model.tok_embeddings is not None:
            units.append((model.tok_embeddings, False))
        if OpGroup.HEAD in kept and model.output is not None:
            units.append((model.output, False))
    return units


def head_loss_context(model: nn.Module, y: torch.Tensor) -> contextlib.AbstractContextManager:
    """Within: the model returns the loss sum over ``y`` when its head is chunked (else its
    logits, and this does nothing)."""
    head = getattr(model, "output", None)
    return head.targets(y) if isinstance(head, ChunkedLMHead) else contextlib.nullcontext()


__all__ = ["SlicedMLP", "split_mlps", "ChunkedLMHead", "chunk_head", "apply_osdp_modules", "osdp_units",
           "head_loss_context", "SLICES"]
