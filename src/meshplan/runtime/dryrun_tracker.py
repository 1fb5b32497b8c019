"""The dry run's memory tracker: torch's MemTracker, its peak attributed to what allocated each tensor.

MemTracker (torch.distributed._tools.mem_tracker) sees every tensor storage allocated through the
dispatcher and every storage resize, and files it under a category (Parameter, Buffer, Gradient,
Activation, Temp, Optstate). A peak by category does not say *which* activations: to trust a dry
run, a user has to see that the norm inputs, the attention outputs or the logits are what the cost
model says they are. ``StepMemTracker`` therefore tags every storage with its **origin** when it is
first allocated: the innermost module running at that moment (the layer index replaced by ``*``,
so the 80 layers of a stage add up to one row), the op that allocated it and its dtype. It keeps a
running total per (category, module, op, dtype) next to MemTracker's per-category one, and copies
it whenever the peak rises: ``peak_origins()`` is what was live at the peak, by origin.

Ops that DTensor's sharding propagation runs to find an output shape are not counted (see
``ShardingPropagation``).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import asdict, dataclass

import torch
from torch import nn

NO_MODULE = "-"
"""Module of a tensor allocated outside any module's forward or backward (the loss, the optimizer)."""
NO_OP = "-"
"""Op of a tensor the tracker registered without an op (parameters and optimizer states tracked
from outside the tracker's context, gradients seen through hooks)."""
ORIGIN_MIN_BYTES = 2**20
"""Origins below 1 MiB at the peak are summed into one row (a report reads the large ones)."""

_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")
_WRAPPERS = re.compile(r"\._(checkpoint_wrapped_module|fsdp_wrapped_module|orig_mod)")


@dataclass(frozen=True)
class PeakOrigin:
    """Bytes live at the tracked peak that share a category, module, op and dtype."""

    category: str
    """MemTracker's category at the peak (Parameter, Gradient, Activation, Temp, Optstate, Buffer)."""
    module: str
    """Innermost module running when the tensor was allocated, layer indices as ``*``
    (e.g. ``Transformer.layers.*.attention_norm``); ``-`` outside every module."""
    op: str
    """The op that allocated it (``aten.mm.default``), ``-`` if none (see NO_OP)."""
    dtype: str
    bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def module_pattern(fqn: str) -> str:
    """``Transformer.layers.17._checkpoint_wrapped_module.feed_forward.w1`` ->
    ``Transformer.layers.*.feed_forward.w1``: one row for every layer of a stage."""
    return _LAYER_INDEX.sub(".*", _WRAPPERS.sub("", fqn))


def innermost_module(parents: set[str]) -> str:
    """The innermost of ModTracker's active modules: fully qualified names nest, so the longest."""
    names = [p for p in parents if p != "Global"]
    return module_pattern(max(names, key=lambda n: (n.count("."), len(n)))) if names else NO_MODULE


class ShardingPropagation:
    """Marks DTensor's sharding propagation. To find an op's output shape, DTensor runs the op on
    fake tensors of the *global* shape (``ShardingPropagator._propagate_tensor_meta_non_cached``)
    under the active fake mode, which in a dry run is the tracker's own: MemTracker would count
    these global-shape shadows (a (B, S, V) fp32 copy of vocabulary-sharded logits, a whole
    embedding's Adam temporaries) as if the rank allocated them. Installed as the propagator's
    ``_fake_mode_lock``, the hook torch gives for serialising that block; re-entrant."""

    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1


@contextlib.contextmanager
def marking_sharding_propagation(marker: ShardingPropagation):
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    previous = ShardingPropagator._fake_mode_lock
    ShardingPropagator._fake_mode_lock = marker
    try:
        yield
    finally:
        ShardingPropagator._fake_mode_lock = previous


def step_tracker(propagation: ShardingPropagation):
    """torch's MemTracker, accepting a module called again within a step (gradient accumulation,
    pipeline micro-batches): only its global peak is read, not its per-module statistics; every
    storage is tagged with its origin (module, op, dtype) and the peak is kept by origin too. Ops
    run by DTensor's sharding propagation (global-shape shadows) are not counted."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _UpdateType

    class StepMemTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self._op = NO_OP
            self._dtype: torch.dtype | None = None
            self._origin_bytes: dict[tuple[str, str, str, str], int] = {}
            self._peak_origin_bytes: dict[tuple[str, str, str, str], int] = {}
            self._peak_at = ""

        def _pre_fw_hook(self, module: nn.Module, inputs) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

        def _track(self, reftype, t: torch.Tensor) -> None:
            self._dtype = t.dtype
            super()._track(reftype, t)

        def _update_and_maybe_create_winfos(self, t: torch.Tensor, reftype, update_existing: bool = False):
            self._dtype = t.dtype
            return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

        def _key(self, winfo, reftype) -> tuple[str, str, str, str]:
            return (str(getattr(reftype, "value", reftype)), *winfo.origin)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            if not hasattr(winfo, "origin"):
                dtype = str(self._dtype).removeprefix("torch.") if self._dtype is not None else "-"
                winfo.origin = (innermost_module(self._mod_tracker.parents), self._op, dtype)
            totals, key = self._origin_bytes, self._key(winfo, winfo.reftype)
            if u_type == _UpdateType.ADD:
                totals[key] = totals.get(key, 0) + winfo.mem_consumed
            elif u_type == _UpdateType.DEL:
                totals[key] = totals.get(key, 0) - winfo.mem_consumed
            elif u_type == _UpdateType.REF:
                old = self._key(winfo, old_reftype)
                totals[old] = totals.get(old, 0) - winfo.mem_consumed
                totals[key] = totals.get(key, 0) + winfo.mem_consumed
            elif u_type == _UpdateType.SIZE:
                totals[key] = totals.get(key, 0) + winfo.mem_consumed - old_mem_consumed
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _update_peak_stats(self, peak_state) -> None:
            # Only the global peak (MemTracker also walks every module's local peak on every op:
            # O(modules) per op, minutes on an 80-layer stage, for statistics not read here).
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)
                    self._peak_origin_bytes = {k: v for k, v in self._origin_bytes.items() if v}
                    phase = "optimizer" if self._in_opt else ("backward" if self._mod_tracker.is_bw else "forward")
                    self._peak_at = f"{phase} {innermost_module(self._mod_tracker.parents)}"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if propagation.depth:
                return func(*args, **(kwargs or {}))
            self._op = str(func)
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self._op = NO_OP

        def peak_at(self) -> str:
            """Where the step was when the peak was reached: phase and innermost module."""
            return self._peak_at

        def peak_origins(self) -> list[PeakOrigin]:
            """What was live at the peak, by (category, module, op, dtype), largest first; origins
            under ORIGIN_MIN_BYTES summed into one row per category (module, op and dtype ``*``)."""
            rows: list[PeakOrigin] = []
            small: dict[str, int] = {}
            for (cat, module, op, dtype), n in self._peak_origin_bytes.items():
                if n >= ORIGIN_MIN_BYTES:
                    rows.append(PeakOrigin(cat, module, op, dtype, n))
                elif n > 0:
                    small[cat] = small.get(cat, 0) + n
            rows += [PeakOrigin(cat, "*", "*", "*", n) for cat, n in small.items()]
            return sorted(rows, key=lambda r: -r.bytes)

    return StepMemTracker()
