"""What one optimizer step trains: sequence length, global batch, precision, optimizer."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count
from meshplan.spec.seqlen import DocBalance, SeqLenDist
from meshplan.spec.expert_load import ExpertLoad


class Precision(str, enum.Enum):
    """Compute precision of the matmuls (mixed precision keeps fp32 master weights).

    fp8 and fp4 are the GEMM input formats; how their scales are chosen is the ``Recipe``.
    Weights, gradients and activations between GEMMs stay in bf16 (Transformer Engine's mixed
    fp8/fp4 training: Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 4; NVIDIA
    2025, "Pretraining LLMs with NVFP4")."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP4 = "fp4"
    FP32 = "fp32"


class Recipe(str, enum.Enum):
    """How an fp8 or fp4 GEMM scales its inputs (Transformer Engine / Megatron-Core recipes).

    fp8: ``delayed`` (one scale per tensor from an amax history, TE DelayedScaling), ``tensorwise``
    (one scale per tensor from the current amax, TE Float8CurrentScaling), ``rowwise`` (one scale
    per row, torchao), ``blockwise`` (128x128 weight / 1x128 activation blocks, DeepSeek-V3 Sec.
    3.3.2, TE Float8BlockScaling), ``mxfp8`` (OCP microscaling: E8M0 scale per 32 elements, TE
    MXFP8BlockScaling). fp4: ``nvfp4`` (E4M3 scale per 16 elements + tensor scale) and ``mxfp4``
    (OCP microscaling, E8M0 scale per 32 elements)."""

    DELAYED = "delayed"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"

    @property
    def block_scaled(self) -> bool:
        """Scales per small block, applied by the tensor cores themselves (Blackwell, CDNA4):
        a GPU must list the recipe in ``GPUSpec.block_scaled_recipes``."""
        return self in (Recipe.MXFP8, Recipe.NVFP4, Recipe.MXFP4)


RECIPES: dict[Precision, tuple[Recipe, ...]] = {
    Precision.FP8: (Recipe.DELAYED, Recipe.TENSORWISE, Recipe.ROWWISE, Recipe.BLOCKWISE, Recipe.MXFP8),
    Precision.FP4: (Recipe.NVFP4, Recipe.MXFP4),
}
"""The recipes each low precision accepts; the first is its default (Megatron-Core's
``--fp8-recipe`` default is ``delayed``; ``--fp4-recipe`` default is ``nvfp4``)."""


class MoeDispatcher(str, enum.Enum):
    """How routed tokens reach their experts (Megatron --moe-token-dispatcher-type)."""

    ALLTOALL = "alltoall"  # each token copy sent to its expert's rank (all-to-all, dispatch + combine)
    ALLGATHER = "allgather"  # every rank gathers all tokens of its EP group, reduce-scatter back
    FLEX = "flex"  # DeepEP / HybridEP: one copy per picked rank, per picked node over the NICs


class Optimizer(str, enum.Enum):
    ADAMW = "adamw"  # two fp32 moments per parameter
    ADAM = "adam"
    SGD = "sgd"  # one fp32 momentum per parameter


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    seq_len: int
    """S: tokens per sequence."""
    global_batch: int
    """B: sequences per optimizer step, over all data-parallel ranks."""
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    recipe: Recipe | None = None
    """Scaling recipe of fp8/fp4 GEMMs (``RECIPES``); None: the precision's default recipe for
    fp8/fp4 (filled in on construction), and must stay None for bf16/fp16/fp32."""

    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    """Token dispatcher of MoE layers (Megatron-Core's default: alltoall)."""
    overlap_grad_reduce: bool = True
    """Megatron-Core's ``--overlap-grad-reduce``: the data-parallel gradient reduction (all-reduce,
    or reduce-scatter under the distributed optimizer) runs in buckets during the backward,
    hidden behind it up to the stack's fitted ``Calibration.dp_overlap``; False: it runs after
    the backward, all of it exposed. Megatron-LM's flag is off by default (store_true), but
    Megatron-Bridge's ``CommOverlapConfig`` and NeMo 2.0's recipes turn it on at any data
    parallelism over the distributed optimizer (calib/recipes.py), and meshplan's plans are for
    runtimes that do: on unless a run says otherwise."""
    moe_capacity_factor: float | None = None
    """Expert capacity over the mean tokens per expert: tokens beyond it are dropped (Fedus et
    al. 2022 Sec. 2.2; Megatron --moe-expert-capacity-factor). None: dropless."""
    seq_len_dist: SeqLenDist | None = None
    """Document lengths of the data, packed into ``seq_len`` sequences with document masks
    (cost/packing.py); None: every sequence is one document of ``seq_len`` tokens."""
    doc_balance: DocBalance = DocBalance.STREAM
    """How documents reach the data-parallel ranks (needs ``seq_len_dist``)."""
    cp_buckets: bool = False
    """Per-bucket context parallel: documents of at most seq_len/cp tokens are trained without
    CP, the longer ones split over the CP ranks (ByteScale; needs ``seq_len_dist``)."""
    expert_load: ExpertLoad | None = None
    """How the router spreads tokens over the experts (spec/expert_load.py: a Zipf skew or a
    routing log). None: the calibration's routing imbalance (``Calibration.moe_routing_imbalance``)."""

    def __post_init__(self) -> None:
        for f, enum_cls in (("precision", Precision), ("optimizer", Optimizer),
                            ("moe_dispatcher", MoeDispatcher), ("doc_balance", DocBalance)):
            try:
                object.__setattr__(self, f, enum_cls(getattr(self, f)))
            except ValueError:
                raise MeshplanError(f"{f}={getattr(self, f)!r} is not one of "
                                    f"{', '.join(e.value for e in enum_cls)}") from None
        object.__setattr__(self, "recipe", check_recipe(self.precision, self.recipe))
        cf = self.moe_capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or cf <= 0):
            raise MeshplanError(f"moe_capacity_factor must be a positive number (or None: dropless), got {cf!r}")
        for f in ("seq_len", "global_batch"):
            check_count(f, getattr(self, f))
        if self.seq_len_dist is None and (self.doc_balance != DocBalance.STREAM or self.cp_buckets):
            raise MeshplanError("balanced documents and per-bucket context parallel need a sequence-length "
                                "distribution (--seq-len-dist)")
        if not isinstance(self.overlap_grad_reduce, bool):
            raise MeshplanError(f"overlap_grad_reduce must be true or false, got {self.overlap_grad_reduce!r}")
        if not isinstance(self.cp_buckets, bool):
            raise MeshplanError(f"cp_buckets must be true or false, got {self.cp_buckets!r}")
        if self.expert_load is not None and not isinstance(self.expert_load, ExpertLoad):
            raise MeshplanError(f"expert_load must be an ExpertLoad, got {type(self.expert_load).__name__}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @classmethod
    def from_tokens(cls, *, seq_len: int, global_batch_tokens: int, **kw: Any) -> "TrainingSpec":
        """Global batch given in tokens; must be a whole number of sequences."""
        check_count("global_batch_tokens", global_batch_tokens)
        if seq_len < 1 or global_batch_tokens % seq_len:
            raise MeshplanError(
                f"global batch of {global_batch_tokens} tokens is not a whole number of "
                f"{seq_len}-token sequences"
            )
        return cls(seq_len=seq_len, global_batch=global_batch_tokens // seq_len, **kw)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["precision"] = self.precision.value
        out["optimizer"] = self.optimizer.value
        out["recipe"] = self.recipe.value if self.recipe else None
        out["moe_dispatcher"] = self.moe_dispatcher.value
        out["seq_len_dist"] = self.seq_len_dist.to_dict() if self.seq_len_dist else None
        out["doc_balance"] = self.doc_balance.value
        out["expert_load"] = self.expert_load.to_dict() if self.expert_load else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingSpec":
        extra = set(data) - {f.name for f in fields(cls)}
        if extra:
            raise MeshplanError(f"unknown training field(s): {', '.join(sorted(extra))}")
        try:
            data = dict(data)
            if "precision" in data:
                data["precision"] = Precision(data["precision"])
            if "optimizer" in data:
                data["optimizer"] = Optimizer(data["optimizer"])
            if data.get("recipe") is not None:  # absent in plan files before fp8 recipes
                data["recipe"] = Recipe(data["recipe"])
            if data.get("seq_len_dist") is not None:  # absent in plan files before issue 18
                data["seq_len_dist"] = SeqLenDist.from_dict(data["seq_len_dist"])
            if data.get("expert_load") is not None:  # absent in plan files before expert loads
                data["expert_load"] = ExpertLoad.from_dict(data["expert_load"])
            return cls(**data)
        except MeshplanError:
            raise
        except (TypeError, ValueError) as exc:
            raise MeshplanError(f"invalid training description: {exc}") from None


def check_recipe(precision: Precision, recipe: "Recipe | str | None") -> "Recipe | None":
    """The recipe for ``precision``: the given one if the precision accepts it, the precision's
    default when None; MeshplanError for a recipe on bf16/fp16/fp32 or a mismatched one."""
    allowed = RECIPES.get(Precision(precision), ())
    if recipe is None:
        return allowed[0] if allowed else None
    try:
        recipe = Recipe(recipe)
    except ValueError:
        raise MeshplanError(f"recipe={recipe!r} is not one of {', '.join(r.value for r in Recipe)}") from None
    if recipe not in allowed:
        if not allowed:
            raise MeshplanError(f"recipe {recipe.value!r} needs precision fp8 or fp4, not {Precision(precision).value}")
        raise MeshplanError(f"recipe {recipe.value!r} is not an {Precision(precision).value} recipe; "
                            f"{Precision(precision).value} takes {', '.join(r.value for r in allowed)}")
    return recipe
