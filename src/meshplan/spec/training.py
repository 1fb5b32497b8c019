"""What one optimizer step trains: sequence length, global batch, precision, optimizer."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count


class Precision(str, enum.Enum):
    """Compute precision of the matmuls (mixed precision keeps fp32 master weights)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP32 = "fp32"


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

    def __post_init__(self) -> None:
        for f, enum_cls in (("precision", Precision), ("optimizer", Optimizer)):
            try:
                object.__setattr__(self, f, enum_cls(getattr(self, f)))
            except ValueError:
                raise MeshplanError(f"{f}={getattr(self, f)!r} is not one of "
                                    f"{', '.join(e.value for e in enum_cls)}") from None
        for f in ("seq_len", "global_batch"):
            check_count(f, getattr(self, f))

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
            return cls(**data)
        except MeshplanError:
            raise
        except (TypeError, ValueError) as exc:
            raise MeshplanError(f"invalid training description: {exc}") from None
