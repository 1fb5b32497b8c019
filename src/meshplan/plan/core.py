"""``Plan``: how to parallelise one training job (see the package docstring for the mesh layout)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count
from meshplan.plan.choices import (CPMethod, ExpertPlacement, Offload, OpGroup, Recompute, RecomputeModule,
                                   Schedule)
from meshplan.plan.checks import check_plan_fits
from meshplan.plan.dims import ParallelDims
from meshplan.plan.notation import plan_notation
from meshplan.plan.split import even_split

if TYPE_CHECKING:
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec

PLAN_FORMAT_VERSION = 3
"""Version 2 added ``recompute_modules``; a version-1 file reads as the same plan (its selective
recompute is the default module set, the attention core). Version 3 added ``mtp_stage`` (where the
multi-token-prediction modules sit); a version-1 or -2 file reads with them on the last stage."""
READABLE_PLAN_VERSIONS: tuple[int, ...] = (1, 2, 3)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How to parallelise one training job. Frozen; validated on construction."""

    dims: ParallelDims = field(default_factory=ParallelDims)
    zero: int = 0
    """ZeRO stage over ``dp_shard``: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters (FSDP)."""
    sp: bool = False
    """Sequence parallel with TP (Korthikanti et al. 2022, Sec. 4.2.2); needs ``tp > 1``."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    vpp: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved schedules only)."""
    stage_layers: tuple[int, ...] = ()
    """Transformer layers per (virtual) stage, in model order; length ``pp * vpp``. Empty means an
    even split, filled in by :func:`Plan.with_defaults` / :func:`even_split`."""
    mtp_stage: int | None = None
    """The virtual stage (model order) holding the model's multi-token-prediction modules
    (DeepSeek-V3 Sec. 2.2); None: the last, beside the LM head (Megatron-Core's default). A
    Megatron layout (``--pipeline-model-parallel-layout``, ``meshplan.plan.layout``) may put them
    on a stage of their own; the last stage's value is stored as None (one form per plan)."""
    cp_method: CPMethod = CPMethod.RING
    micro_batch: int = 1
    """Sequences per micro-batch on each data-parallel rank."""
    recompute: Recompute = Recompute.NONE
    recompute_layers: tuple[int, ...] = ()
    """Layers recomputed per (virtual) stage under ``recompute``; empty means every layer
    (or none when ``recompute`` is NONE)."""
    recompute_modules: tuple[RecomputeModule, ...] = ()
    """Under selective recompute, the submodules recomputed (Megatron-Core's ``--recompute-modules``,
    :class:`RecomputeModule`); empty: the default, the attention core alone (``core_attn``), and
    ``(core_attn,)`` is stored as empty so that one set has one form. Kept in the enum's order."""
    offload: tuple[Offload, ...] = ()
    """What is kept in host memory (:class:`Offload`); empty: nothing. Kept in the enum's order."""
    offload_layers: int = 0
    """With activations offloaded: the layers of each pipeline rank whose saved tensors go to the
    host (Megatron-Core's ``cpu_offloading_num_layers``, which runs without pipelining); 0: every
    layer (all but the two in flight)."""
    vocab_parallel: bool = False
    """Vocabulary parallelism over the pipeline ranks (Yeung et al. 2024): the embedding and the
    LM head with its loss split over all ``pp`` ranks instead of sitting on the first and last;
    needs ``pp > 1``."""
    keep_gathered: tuple[OpGroup, ...] = ()
    """OSDP's per-operator choice (Jiang et al. 2023, Sec. 3): under zero 3, the operator groups
    whose parameters stay gathered from forward to backward (ZeRO-2 for that group: no re-gather
    in backward, the whole group resident at the peak); the others are sharded and re-gathered.
    Empty: every group sharded. Needs zero 3. Kept in the enum's order."""
    mlp_splits: int = 1
    """OSDP's operator splitting (Jiang et al. 2023, Sec. 3.2): each MLP's weights split along its
    inner width into this many slices, gathered one at a time under zero 3 (1: whole)."""
    head_splits: int = 1
    """The LM head and its cross-entropy run on this many chunks of the tokens, so that only one
    chunk's logits exist at a time (recomputed in backward); 1: the whole logits tensor."""
    expert_placement: ExpertPlacement = ExpertPlacement.CONTIGUOUS
    """Which ep rank holds which routed expert; ``balanced`` spreads the hot experts of the
    training's expert load over the ranks (meshplan.cost.expert_load)."""
    expert_replicas: int = 0
    """Extra expert slots per ep rank holding copies of the hottest experts, their tokens split
    over the copies and their gradients all-reduced among them (FlexMoE, Nie et al. 2023)."""

    def __post_init__(self) -> None:
        for f, enum_cls in (("schedule", Schedule), ("recompute", Recompute), ("cp_method", CPMethod),
                            ("expert_placement", ExpertPlacement)):
            try:
                object.__setattr__(self, f, enum_cls(getattr(self, f)))
            except ValueError:
                raise MeshplanError(f"{f}={getattr(self, f)!r} is not one of "
                                    f"{', '.join(e.value for e in enum_cls)}") from None
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        object.__setattr__(self, "recompute_layers", tuple(self.recompute_layers))
        try:
            modules = {RecomputeModule(m) for m in self.recompute_modules}
        except ValueError:
            raise MeshplanError(f"recompute_modules={list(self.recompute_modules)!r}: each must be one of "
                                f"{', '.join(m.value for m in RecomputeModule)}") from None
        if modules and self.recompute != Recompute.SELECTIVE:
            raise MeshplanError(f"recompute_modules {'+'.join(m.value for m in RecomputeModule if m in modules)} "
                                f"name what selective recompute recomputes: they need recompute 'selective', "
                                f"got {self.recompute.value!r}")
        object.__setattr__(self, "recompute_modules", () if modules == {RecomputeModule.CORE_ATTN}
                           else tuple(m for m in RecomputeModule if m in modules))
        try:
            chosen = {Offload(o) for o in self.offload}
        except ValueError:
            raise MeshplanError(f"offload={list(self.offload)!r}: each must be one of "
                                f"{', '.join(o.value for o in Offload)}") from None
        object.__setattr__(self, "offload", tuple(o for o in Offload if o in chosen))
        try:
            kept = {OpGroup(g) for g in self.keep_gathered}
        except ValueError:
            raise MeshplanError(f"keep_gathered={list(self.keep_gathered)!r}: each must be one of "
                                f"{', '.join(g.value for g in OpGroup)}") from None
        object.__setattr__(self, "keep_gathered", tuple(g for g in OpGroup if g in kept))
        check_count("mlp_splits", self.mlp_splits)
        if isinstance(self.offload_layers, bool) or not isinstance(self.offload_layers, int) or self.offload_layers < 0:
            raise MeshplanError(f"offload_layers must be a whole number >= 0, got {self.offload_layers!r}")
        if self.offload_layers and Offload.ACTIVATIONS not in chosen:
            raise MeshplanError(f"offload_layers={self.offload_layers} counts layers whose activations are "
                                f"offloaded: it needs offload 'activations'")
        check_count("head_splits", self.head_splits)
        if kept and self.zero != 3:
            raise MeshplanError(f"keep_gathered needs zero 3 (below it every parameter is already kept "
                                f"gathered), got zero {self.zero}")
        if self.mlp_splits > 1 and self.zero != 3:
            raise MeshplanError(f"mlp_splits={self.mlp_splits} needs zero 3: splitting only bounds the "
                                f"MLP parameters gathered at once, got zero {self.zero}")
        if self.mlp_splits > 1 and OpGroup.MLP in kept:
            raise MeshplanError("mlp_splits > 1 with the MLP kept gathered: a kept MLP is never "
                                "gathered a slice at a time")
        d = self.dims
        if Offload.PARAMS in chosen and Offload.OPTIMIZER not in chosen:
            raise MeshplanError("offload 'params' needs 'optimizer' too: the step runs on the host, "
                                "where the parameters and gradients then are")
        if Offload.PARAMS in chosen and self.zero != 3:
            raise MeshplanError(f"offload 'params' needs zero 3 (each GPU gathers the parameters it "
                                f"copies up from the host), got zero {self.zero}")
        if self.zero not in (0, 1, 2, 3):
            raise MeshplanError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if d.dp_shard > 1 and self.zero == 0:
            raise MeshplanError(
                f"dp_shard={d.dp_shard} needs zero >= 1; plain data parallel is dp_replicate"
            )
        if self.sp and d.tp == 1:
            raise MeshplanError("sequence parallel (sp) needs tp > 1")
        if self.vocab_parallel and d.pp == 1:
            raise MeshplanError("vocab_parallel splits the vocabulary over pipeline ranks: it needs pp > 1")
        if isinstance(self.expert_replicas, bool) or not isinstance(self.expert_replicas, int) or self.expert_replicas < 0:
            raise MeshplanError(f"expert_replicas must be a whole number >= 0, got {self.expert_replicas!r}")
        if (self.expert_replicas or self.expert_placement != ExpertPlacement.CONTIGUOUS) and d.ep == 1:
            raise MeshplanError("expert placement and replicas spread experts over expert-parallel ranks: they need ep > 1")
        check_count("vpp", self.vpp)
        check_count("micro_batch", self.micro_batch)
        if self.vpp > 1 and not self.schedule.supports_virtual_stages:
            raise MeshplanError(
                f"vpp={self.vpp} needs an interleaved schedule, not {self.schedule.value!r}"
            )
        if self.vpp > 1 and d.pp == 1:
            raise MeshplanError(f"vpp={self.vpp} needs pp > 1")
        n_stages = d.pp * self.vpp
        if self.stage_layers:
            if len(self.stage_layers) != n_stages:
                raise MeshplanError(
                    f"stage_layers has {len(self.stage_layers)} entries; pp*vpp={n_stages} stages"
                )
            # the first and last stage may hold no layer (embedding / loss only), and so may the MTP's
            inner = ([n for i, n in enumerate(self.stage_layers) if 0 < i < n_stages - 1 and i != self.mtp_stage]
                     if n_stages > 1 else list(self.stage_layers))
            if any(n < 1 for n in inner) or any(n < 0 for n in self.stage_layers):
                raise MeshplanError(f"every stage needs at least one layer (the first and last may hold "
                                    f"only the embedding / the loss, a stage the MTP modules only): "
                                    f"{self.stage_layers}")
        if self.mtp_stage is not None:
            m = self.mtp_stage
            if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < n_stages:
                raise MeshplanError(f"mtp_stage={m!r} is not a virtual stage (0 to pp*vpp-1 = {n_stages - 1})")
            if not self.stage_layers and m != n_stages - 1:
                raise MeshplanError(f"mtp_stage={m} needs the layer split it sits in (stage_layers, or a "
                                    f"Megatron layout): the even split fills every stage")
            if self.stage_layers and any(self.stage_layers[self.mtp_stage + 1:]):
                raise MeshplanError(f"mtp_stage={self.mtp_stage}: the MTP modules run after the whole stack, "
                                    f"but stages after it hold layers ({self.stage_layers})")
            if self.mtp_stage == n_stages - 1:
                object.__setattr__(self, "mtp_stage", None)  # the default placement, one form
        if self.recompute_layers:
            if len(self.recompute_layers) != n_stages:
                raise MeshplanError(
                    f"recompute_layers has {len(self.recompute_layers)} entries; "
                    f"pp*vpp={n_stages} stages"
                )
            if self.recompute == Recompute.NONE and any(self.recompute_layers):
                raise MeshplanError("recompute_layers given but recompute is 'none'")
            if self.stage_layers and any(
                r < 0 or r > n for r, n in zip(self.recompute_layers, self.stage_layers)
            ):
                raise MeshplanError(
                    f"recompute_layers {self.recompute_layers} must lie between 0 and "
                    f"stage_layers {self.stage_layers}"
                )

    @property
    def num_stages(self) -> int:
        return self.dims.pp * self.vpp

    # ---- checks against what is trained -------------------------------------------------
    def validate_for(self, model: "ModelSpec", training: "TrainingSpec", num_gpus: int | None = None) -> None:
        """Raise MeshplanError naming the first value that does not fit the model or batch."""
        check_plan_fits(self, model, training, num_gpus)

    def num_microbatches(self, training: "TrainingSpec") -> int:
        """Gradient-accumulation steps = global_batch / (dp * micro_batch)."""
        return training.global_batch // (self.dims.dp * self.micro_batch)

    # ---- defaults and derived per-stage values -------------------------------------------
    def with_defaults(self, model: "ModelSpec") -> "Plan":
        """Fill ``stage_layers`` (even split) and ``recompute_layers`` (all or none)."""
        layers = self.stage_layers or even_split(model.num_layers, self.num_stages)
        if self.recompute_layers:
            rec = self.recompute_layers
        elif self.recompute == Recompute.NONE:
            rec = tuple(0 for _ in layers)
        else:
            rec = tuple(layers)
        if self.recompute != Recompute.NONE and not any(rec):
            # recomputing zero layers is no recompute: one canonical form, so that exports and
            # their imports agree (Megatron has no "full recompute of 0 layers")
            return replace(self, stage_layers=tuple(layers), recompute=Recompute.NONE,
                           recompute_layers=tuple(rec), recompute_modules=())
        return replace(self, stage_layers=tuple(layers), recompute_layers=tuple(rec))

    def stage_rank(self, stage: int) -> int:
        """Pipeline rank that holds virtual stage ``stage`` (looped placement)."""
        return stage % self.dims.pp

    def layers_on_rank(self, rank: int) -> int:
        """Layers the pipeline rank ``rank`` holds over its virtual stages."""
        return sum(n for i, n in enumerate(self.stage_layers) if self.stage_rank(i) == rank)

    def recomputed_on_rank(self, rank: int) -> int:
        """Recomputed layers of the pipeline rank ``rank`` over its virtual stages."""
        return sum(n for i, n in enumerate(self.recompute_layers) if self.stage_rank(i) == rank)

    def offloaded_on_rank(self, rank: int) -> int | None:
        """Layers of ``rank`` whose activations go to the host when ``offload_layers`` counts them
        (at most the rank's layers); None: the plan does not count them (every layer, where it
        offloads activations: ``meshplan.cost.offload``)."""
        return min(self.offload_layers, self.layers_on_rank(rank)) if self.offload_layers else None

    @property
    def mtp_rank(self) -> int:
        """Pipeline rank that runs the MTP modules (the last unless ``mtp_stage`` says otherwise)."""
        return self.stage_rank(self.num_stages - 1 if self.mtp_stage is None else self.mtp_stage)

    # ---- notation and JSON ---------------------------------------------------------------
    def notation(self) -> str:
        """Compact one-line form that maps one-to-one to the plan flags (``meshplan.plan.notation``)."""
        return plan_notation(self)

    @property
    def uneven_split(self) -> bool:
        """Whether ``stage_layers`` is given and differs from the even split of its layers."""
        if not self.stage_layers:
            return False
        if sum(self.stage_layers) < self.num_stages:  # embedding- or loss-only stages: never even
            return True
        return self.stage_layers != even_split(sum(self.stage_layers), self.num_stages)

    @property
    def partial_recompute(self) -> bool:
        """Whether ``recompute_layers`` names fewer layers than the stages hold (not simply all)."""
        return bool(self.recompute_layers) and self.recompute_layers != self.stage_layers

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schedule"] = self.schedule.value
        out["recompute"] = self.recompute.value
        out["cp_method"] = self.cp_method.value
        out["stage_layers"] = list(self.stage_layers)
        out["recompute_layers"] = list(self.recompute_layers)
        out["recompute_modules"] = [m.value for m in self.recompute_modules]
        out["offload"] = [o.value for o in self.offload]
        out["keep_gathered"] = [g.value for g in self.keep_gathered]
        out["expert_placement"] = self.expert_placement.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        try:
            data = dict(data)
            dims = ParallelDims(**data.pop("dims", {}))
            sp = data.pop("sp", False)
            if not isinstance(sp, bool):
                raise MeshplanError(f"sp must be true or false, got {sp!r}")
            return cls(
                dims=dims,
                zero=_json_int("zero", data.pop("zero", 0)),
                sp=sp,
                schedule=Schedule(data.pop("schedule", Schedule.ONE_F_ONE_B.value)),
                vpp=_json_int("vpp", data.pop("vpp", 1)),
                stage_layers=tuple(_json_int("stage_layers", x) for x in data.pop("stage_layers", ())),
                mtp_stage=_json_optional_int("mtp_stage", data.pop("mtp_stage", None)),
                cp_method=CPMethod(data.pop("cp_method", CPMethod.RING.value)),
                micro_batch=_json_int("micro_batch", data.pop("micro_batch", 1)),
                recompute=Recompute(data.pop("recompute", Recompute.NONE.value)),
                recompute_layers=tuple(_json_int("recompute_layers", x) for x in data.pop("recompute_layers", ())),
                recompute_modules=tuple(data.pop("recompute_modules", ())),
                offload=tuple(data.pop("offload", ())),
                offload_layers=_json_int("offload_layers", data.pop("offload_layers", 0)),
                vocab_parallel=_json_bool("vocab_parallel", data.pop("vocab_parallel", False)),
                keep_gathered=tuple(data.pop("keep_gathered", ())),
                mlp_splits=_json_int("mlp_splits", data.pop("mlp_splits", 1)),
                head_splits=_json_int("head_splits", data.pop("head_splits", 1)),
                expert_placement=ExpertPlacement(data.pop("expert_placement", ExpertPlacement.CONTIGUOUS.value)),
                expert_replicas=_json_int("expert_replicas", data.pop("expert_replicas", 0)),
                **_no_extra("plan", data),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, MeshplanError):
                raise
            raise MeshplanError(f"invalid plan: {exc}") from None


def _json_bool(name: str, value: Any) -> bool:
    """A plan file's boolean, as written (``"false"`` is not False)."""
    if not isinstance(value, bool):
        raise MeshplanError(f"{name} must be true or false, got {value!r}")
    return value


def _json_optional_int(name: str, value: Any) -> int | None:
    return None if value is None else _json_int(name, value)


def _json_int(name: str, value: Any) -> int:
    """An integer read from a file, taken as written: 1.5 is not rounded nor "8" parsed."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise MeshplanError(f"{name} must be an integer, got {value!r}")
    return value


def _no_extra(what: str, leftover: dict[str, Any]) -> dict[str, Any]:
    if leftover:
        raise MeshplanError(f"unknown {what} field(s): {', '.join(sorted(leftover))}")
    return {}
