"""``PlanArrays``: many plans as a struct of equal-length NumPy arrays (one row per plan): what
the cost model estimates in one pass, and what the search enumerates (one row per global
configuration, ``meshplan.search.space``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from meshplan.plan import (CPMethod, ExpertPlacement, ParallelDims, Plan, Recompute, Schedule, group_choices,
                           group_code, offload_choices, offload_code, recompute_module_choices,
                           recompute_module_code)

SCHEDULE_CODES: tuple[Schedule, ...] = tuple(Schedule)
"""Integer code of a schedule = its index here (gpipe 0, 1f1b 1, interleaved 2, zero-bubble 3)."""
RECOMPUTE_CODES: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
CP_METHOD_CODES: tuple[CPMethod, ...] = (CPMethod.RING, CPMethod.ALL_TO_ALL)

GPIPE = SCHEDULE_CODES.index(Schedule.GPIPE)
ONE_F_ONE_B = SCHEDULE_CODES.index(Schedule.ONE_F_ONE_B)
INTERLEAVED = SCHEDULE_CODES.index(Schedule.INTERLEAVED_1F1B)
ZERO_BUBBLE = SCHEDULE_CODES.index(Schedule.ZERO_BUBBLE)
RC_NONE, RC_SELECTIVE, RC_FULL = 0, 1, 2
CP_RING, CP_ALL_TO_ALL = 0, 1


@dataclass(frozen=True)
class PlanArrays:
    """Equal-length arrays, one entry per plan. Layer splits are even (``even_split``) and the
    recompute policy applies to every layer; per-stage choices live on ``Plan`` itself."""

    dp_replicate: np.ndarray
    dp_shard: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    sp: np.ndarray  # bool
    schedule: np.ndarray  # index into SCHEDULE_CODES
    vpp: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray  # index into RECOMPUTE_CODES
    cp_method: np.ndarray  # index into CP_METHOD_CODES
    etp: np.ndarray | None = None
    """Expert tensor parallel degree, resolved (``ParallelDims.expert_tp``); None: tp."""
    offload: np.ndarray | None = None
    """What lives in host memory, as the bit mask of ``meshplan.plan.offload_code``; None: nothing."""
    offload_layers: np.ndarray | None = None
    """With activation offload, the layers per pipeline rank whose activations go to the host
    (``Plan.offload_layers``, Megatron's ``cpu_offloading_num_layers``); 0 (None): every layer."""
    vocab_parallel: np.ndarray | None = None
    """Vocabulary parallelism over the pipeline ranks (bool); None: off."""
    keep: np.ndarray | None = None
    """OSDP: operator groups kept gathered under zero 3, as the bit mask of
    ``meshplan.plan.group_code``; None: none (every group sharded)."""
    mlp_splits: np.ndarray | None = None
    """Slices each MLP is gathered in (``Plan.mlp_splits``); None: 1."""
    head_splits: np.ndarray | None = None
    """Token chunks of the LM head and loss (``Plan.head_splits``); None: 1."""
    expert_balanced: np.ndarray | None = None
    """Experts placed by their load (``ExpertPlacement.BALANCED``, bool); None: contiguous."""
    expert_replicas: np.ndarray | None = None
    """Replica slots per ep rank for hot experts (``Plan.expert_replicas``); None: 0."""
    recompute_modules: np.ndarray | None = None
    """Under selective recompute, the modules recomputed, as the bit mask of
    ``meshplan.plan.recompute_module_code`` (0: the attention core alone); None: 0."""

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", np.asarray(self.tp))
        for name in ("offload", "offload_layers"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros_like(np.asarray(self.tp)))
        for name, default in (("keep", 0), ("mlp_splits", 1), ("head_splits", 1)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(np.shape(self.tp), default, dtype=np.int64))
        if self.vocab_parallel is None:
            object.__setattr__(self, "vocab_parallel", np.zeros(np.shape(self.tp), dtype=bool))
        if self.expert_balanced is None:
            object.__setattr__(self, "expert_balanced", np.zeros(np.shape(self.tp), dtype=bool))
        if self.expert_replicas is None:
            object.__setattr__(self, "expert_replicas", np.zeros_like(np.asarray(self.tp)))
        if self.recompute_modules is None:
            object.__setattr__(self, "recompute_modules", np.zeros_like(np.asarray(self.tp)))
        n = None
        for f in fields(self):
            a = np.asarray(getattr(self, f.name))
            a = a.astype(bool if f.name in _BOOL_FIELDS else np.int64, copy=False)
            a = np.atleast_1d(a)
            object.__setattr__(self, f.name, a)
            if n is None:
                n = a.shape
            elif a.shape != n:
                raise ValueError(f"PlanArrays field {f.name} has shape {a.shape}, expected {n}")

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @property
    def dp(self) -> np.ndarray:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> np.ndarray:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @classmethod
    def from_plans(cls, plans: list[Plan]) -> "PlanArrays":
        def col(get):
            return np.array([get(p) for p in plans])

        return cls(
            dp_replicate=col(lambda p: p.dims.dp_replicate),
            dp_shard=col(lambda p: p.dims.dp_shard),
            tp=col(lambda p: p.dims.tp),
            pp=col(lambda p: p.dims.pp),
            cp=col(lambda p: p.dims.cp),
            ep=col(lambda p: p.dims.ep),
            zero=col(lambda p: p.zero),
            sp=col(lambda p: p.sp),
            schedule=col(lambda p: SCHEDULE_CODES.index(p.schedule)),
            vpp=col(lambda p: p.vpp),
            micro_batch=col(lambda p: p.micro_batch),
            recompute=col(lambda p: RECOMPUTE_CODES.index(p.recompute)),
            cp_method=col(lambda p: CP_METHOD_CODES.index(p.cp_method)),
            etp=col(lambda p: p.dims.expert_tp),
            offload=col(lambda p: offload_code(p.offload)),
            offload_layers=col(lambda p: p.offload_layers),
            vocab_parallel=col(lambda p: p.vocab_parallel),
            keep=col(lambda p: group_code(p.keep_gathered)),
            mlp_splits=col(lambda p: p.mlp_splits),
            head_splits=col(lambda p: p.head_splits),
            expert_balanced=col(lambda p: p.expert_placement == ExpertPlacement.BALANCED),
            expert_replicas=col(lambda p: p.expert_replicas),
            recompute_modules=col(lambda p: recompute_module_code(p.recompute_modules)),
        )

    def plan(self, i: int, stage_layers: tuple[int, ...] = (),
             recompute_layers: tuple[int, ...] = ()) -> Plan:
        """The ``Plan`` of row ``i`` (even split and all-layer recompute unless layers are given)."""
        recompute = RECOMPUTE_CODES[int(self.recompute[i])]
        return Plan(
            dims=ParallelDims(
                dp_replicate=int(self.dp_replicate[i]), dp_shard=int(self.dp_shard[i]),
                tp=int(self.tp[i]), pp=int(self.pp[i]), cp=int(self.cp[i]), ep=int(self.ep[i]),
                etp=0 if self.etp[i] == self.tp[i] else int(self.etp[i]),
            ),
            zero=int(self.zero[i]),
            sp=bool(self.sp[i]),
            schedule=SCHEDULE_CODES[int(self.schedule[i])],
            vpp=int(self.vpp[i]),
            micro_batch=int(self.micro_batch[i]),
            recompute=recompute,
            cp_method=CP_METHOD_CODES[int(self.cp_method[i])],
            stage_layers=tuple(stage_layers),
            recompute_layers=tuple(recompute_layers) if recompute != Recompute.NONE else (),
            offload=offload_choices(int(self.offload[i])),
            offload_layers=int(self.offload_layers[i]),
            vocab_parallel=bool(self.vocab_parallel[i]),
            keep_gathered=group_choices(int(self.keep[i])),
            mlp_splits=int(self.mlp_splits[i]),
            head_splits=int(self.head_splits[i]),
            expert_placement=ExpertPlacement.BALANCED if self.expert_balanced[i] else ExpertPlacement.CONTIGUOUS,
            expert_replicas=int(self.expert_replicas[i]),
            recompute_modules=(recompute_module_choices(int(self.recompute_modules[i]))
                               if recompute == Recompute.SELECTIVE else ()),
        )

    def take(self, index) -> "PlanArrays":
        """Rows selected by an index array, a boolean mask or a slice. The columns are already
        checked and converted, so the rows are set directly (no second pass of
        ``__post_init__``: the search takes rows thousands of times)."""
        out = object.__new__(PlanArrays)
        shape = None
        for name in _FIELD_NAMES:
            a = getattr(self, name)
            if a.strides == (0,) and a.size:  # one value on every row (a broadcast): stays one
                continue
            a = a[index]
            object.__setattr__(out, name, a if a.ndim else a[None])
            shape = a.shape if a.ndim else (1,)
        for name in _FIELD_NAMES:
            a = getattr(self, name)
            if a.strides == (0,) and a.size:
                object.__setattr__(out, name, np.broadcast_to(a[:1], shape) if shape is not None
                                   else np.atleast_1d(a[index]))
        return out


_BOOL_FIELDS = frozenset(("sp", "vocab_parallel", "expert_balanced"))
_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PlanArrays))
