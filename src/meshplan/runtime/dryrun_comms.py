"""Count the collectives a simulated rank issues: kind, mesh axis and bytes (torch dispatch).

A ``TorchDispatchMode`` sees every c10d and functional-collective op (FSDP2's all-gathers and
reduce-scatters, DTensor's tensor-parallel collectives, the all-to-alls of Ulysses and expert
parallel, the pipeline's and ring attention's send/recv) with its tensors and process group, so
on the fake process group it records what a real rank would send without sending anything.
Bytes are the size of the collective's buffer as torch's own ``CollectiveOp`` helper measures it
(an all-gather's output, a reduce-scatter's input, an all-reduce's tensor, a send's tensor).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.distributed._tools.fake_collectives import (
    CollectiveOp,
    collective_ops,
    sync_ops,
)
from torch.utils._python_dispatch import TorchDispatchMode

_KINDS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("reduce_scatter", "reduce_scatter"), ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("shard_dim_alltoall", "all_to_all"), ("broadcast", "broadcast"), ("reduce_", "reduce"),
    ("isend", "send"), ("send", "send"), ("irecv", "recv"), ("recv", "recv"), ("batch_p2p", "p2p"),
)


def collective_kind(op_name: str) -> str:
    """'c10d._allgather_base_.default' -> 'all_gather' (the first matching fragment)."""
    name = op_name.split(".")[-2] if "." in op_name else op_name
    for fragment, kind in _KINDS:
        if fragment in name:
            return kind
    return name


@dataclass(frozen=True)
class CollectiveTally:
    """Collectives of one kind on one mesh axis: how many and their summed buffer bytes."""

    kind: str
    axis: str
    count: int
    total_bytes: int


class CollectiveCounter(TorchDispatchMode):
    """Tally collectives by (kind, axis); ``axis_of_group`` maps a process-group name to an axis."""

    def __init__(self, axis_of_group: dict[str, str]) -> None:
        super().__init__()
        self.axis_of_group = axis_of_group
        self.counts: Counter[tuple[str, str]] = Counter()
        self.nbytes: Counter[tuple[str, str]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        res = func(*args, **kwargs)
        if func in collective_ops and func not in sync_ops:
            pg = CollectiveOp.get_process_group(func, args)
            axis = self.axis_of_group.get(pg.group_name, f"group of {pg.size()}")
            key = (collective_kind(str(func)), axis)
            self.counts[key] += 1
            self.nbytes[key] += int(CollectiveOp.get_comm_tensor_size(func, res, args, kwargs))
        return res

    def tallies(self) -> list[CollectiveTally]:
        return [CollectiveTally(kind=k, axis=a, count=n, total_bytes=self.nbytes[(k, a)])
                for (k, a), n in sorted(self.counts.items())]


def axis_of_groups(meshes: dict[str, torch.distributed.device_mesh.DeviceMesh]) -> dict[str, str]:
    """Process-group name -> axis name for every named (or flattened) 1-D view in ``meshes``; a
    group that serves several views (torch reuses a group for the same ranks, e.g. dp_shard and
    dp_shard_cp when cp = 1, or ep over all of them) is named by all, joined by '='."""
    names: dict[str, list[str]] = {}
    for name, mesh in meshes.items():
        names.setdefault(mesh.get_group().group_name, []).append(name)
    return {group: "=".join(axes) for group, axes in names.items()}
