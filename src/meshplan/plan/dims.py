"""Degrees of the device-mesh axes (``ParallelDims``) and the one place dp is derived from a GPU
count (``data_parallel_degree``)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count
from meshplan.plan.choices import MESH_AXIS_ORDER, MeshAxis


def _check_positive(name: str, value: int) -> None:
    check_count(name, value)


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degree of every mesh axis, plus expert parallel (which reuses dp_shard x cp ranks)."""

    dp_replicate: int = 1
    """Replicated data parallel (DDP, or the replicate axis of HSDP)."""
    dp_shard: int = 1
    """Sharded data parallel (ZeRO-1/2/3, FSDP); needs ``Plan.zero >= 1`` when above 1."""
    tp: int = 1
    """Tensor parallel (Megatron column/row split); sequence parallel is ``Plan.sp``."""
    pp: int = 1
    """Pipeline-parallel ranks."""
    cp: int = 1
    """Context parallel: the sequence is split over this many ranks."""
    ep: int = 1
    """Expert parallel for MoE layers; borrows ``dp_shard x cp`` ranks (and tp ranks when
    ``etp < tp``): ``etp * ep`` divides ``dp_shard * cp * tp``."""
    etp: int = 0
    """Expert tensor parallel: the experts' own tp degree (Megatron-Core's MoE parallel folding,
    ``--expert-tensor-parallel-size``); 0 means the dense layers' ``tp``. The expert layers then
    see the ``dp_shard x cp x tp`` ranks of a pipeline stage as ``edp x ep x etp`` (innermost
    last), edp = dp_shard * cp * tp / (ep * etp) the experts' data-parallel (ZeRO) degree."""

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"):
            _check_positive(name, getattr(self, name))
        if not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 0:
            raise MeshplanError(f"etp must be a non-negative integer (0: as tp), got {self.etp!r}")
        if self.etp == 0 and (self.dp_shard * self.cp) % self.ep:
            raise MeshplanError(
                f"ep={self.ep} must divide dp_shard*cp={self.dp_shard * self.cp} "
                "(expert parallel reuses the sharded-data and context ranks)"
                # plain data-parallel ranks are replicas (dp_replicate): a user coming from Megatron,
                # whose ep spans them, needs to know sharding them is the way to give ep its ranks
                + (f"; the {self.dp_replicate} data-parallel ranks are replicas: shard them with "
                   "zero >= 1 (--zero 1: dp_shard then defaults to all of dp)" if self.dp_replicate > 1 else "")
            )
        if self.etp and (self.dp_shard * self.cp * self.tp) % (self.etp * self.ep):
            raise MeshplanError(
                f"etp*ep={self.etp}*{self.ep} must divide dp_shard*cp*tp="
                f"{self.dp_shard * self.cp * self.tp} (the experts fold onto those ranks)"
            )

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree (``etp``, or ``tp`` when 0)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """The experts' data-parallel degree: ranks holding the same expert shard."""
        return self.dp_shard * self.cp * self.tp // (self.expert_tp * self.ep)

    @property
    def dp(self) -> int:
        """Total data-parallel degree: how many different micro-batches run side by side."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    def axis_size(self, axis: MeshAxis) -> int:
        return {
            MeshAxis.PP: self.pp,
            MeshAxis.DP_REPLICATE: self.dp_replicate,
            MeshAxis.DP_SHARD: self.dp_shard,
            MeshAxis.CP: self.cp,
            MeshAxis.TP: self.tp,
        }[axis]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """Sizes in ``MESH_AXIS_ORDER``."""
        return tuple(self.axis_size(a) for a in MESH_AXIS_ORDER)


def data_parallel_degree(num_gpus: int, *, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """dp = GPUs / (tp * pp * cp): the data-parallel degree the model-parallel degrees leave
    (ep borrows dp_shard x cp ranks and takes none of its own). The one place dp is derived
    from a GPU count; a count the degrees do not divide is an error."""
    for name, degree in (("GPU count", num_gpus), ("tp", tp), ("pp", pp), ("cp", cp)):
        _check_positive(name, degree)
    model_parallel = tp * pp * cp
    if num_gpus % model_parallel:
        raise MeshplanError(f"{num_gpus} GPUs are not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel}")
    return num_gpus // model_parallel
