"""Sequence parallel: keep the sequence shard for backward and all-gather it again there.

Under tensor + sequence parallel, attention and the MLP take the all-gathered (B, S, D) input of
their sequence-sharded (B, S/tp, D) norm output. Autograd would save that gathered tensor (for the
weight gradients of wq/wk/wv and w1/w3) from forward to backward: tp times what Megatron keeps.
Megatron saves the shard and all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2,
"we store the sequence-parallel input and perform an extra all-gather in backward"), and the cost
model counts activations that way. :func:`keep_shards_for_backward` does the same with autograd's
saved-tensor hooks around the module's forward: a saved tensor that lives in the gathered input's
storage is packed as a reference to the shard, and unpacked by gathering the shard again (once per
backward of the module call, shared by the projections that saved views of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.multiprocessing.reductions import StorageWeakRef


class _Gathered:
    """One module call's gathered input: its shard, and the re-gathered local tensor while the
    backward of that call still has views of it to unpack."""

    def __init__(self, shard: DTensor, gathered: DTensor) -> None:
        self.shard = shard
        self.storage = StorageWeakRef(gathered._local_tensor.untyped_storage())
        self.pending = 0
        self.local: torch.Tensor | None = None

    def unpack(self) -> torch.Tensor:
        if self.local is None:
            full = self.shard.detach().redistribute(self.shard.device_mesh, (Replicate(),) * self.shard.device_mesh.ndim)
            self.local = full._local_tensor
        local = self.local
        self.pending -= 1
        if self.pending == 0:  # the last saved view is back: drop the gathered copy with it
            self.local = None
        return local


@dataclass(frozen=True)
class _PackedView:
    gathered: _Gathered
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    spec: object | None
    """The saved DTensor's spec (None when autograd saved a plain tensor)."""


def _pack(gathered: _Gathered):
    def pack(t: torch.Tensor):
        local = t._local_tensor if isinstance(t, DTensor) else t
        try:
            same = StorageWeakRef(local.untyped_storage()) == gathered.storage
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. other subclasses)
            return t
        if not same:
            return t
        gathered.pending += 1
        return _PackedView(gathered, tuple(local.size()), tuple(local.stride()), local.storage_offset(),
                           t._spec if isinstance(t, DTensor) else None)

    return pack


def _unpack(packed):
    if not isinstance(packed, _PackedView):
        return packed
    view = packed.gathered.unpack().as_strided(packed.size, packed.stride, packed.offset)
    if packed.spec is None:
        return view
    return DTensor(view, packed.spec, requires_grad=False)


def keep_shards_for_backward(module: nn.Module) -> None:
    """``module`` (attention or MLP) already has PrepareModuleInput's hook gathering its first
    input from sequence shards to Replicate: save the shard instead of the gathered input."""
    calls: list[tuple[_Gathered | None, object]] = []
    shards: list[object] = []

    def before_gather(_m: nn.Module, args: tuple) -> None:
        shards.append(args[0])

    def after_gather(_m: nn.Module, args: tuple) -> None:
        shard, x = shards.pop(), args[0]
        if not (torch.is_grad_enabled() and isinstance(shard, DTensor) and isinstance(x, DTensor)):
            calls.append((None, None))
            return
        gathered = _Gathered(shard, x)
        hooks = torch.autograd.graph.saved_tensors_hooks(_pack(gathered), _unpack)
        hooks.__enter__()
        calls.append((gathered, hooks))

    def after_forward(_m: nn.Module, _args: tuple, _out: object) -> None:
        _, hooks = calls.pop()
        if hooks is not None:
            hooks.__exit__(None, None, None)

    module.register_forward_pre_hook(before_gather, prepend=True)
    module.register_forward_pre_hook(after_gather)
    module.register_forward_hook(after_forward, always_call=True)


__all__ = ["keep_shards_for_backward"]
