"""What a published run leaves unsaid, per training stack (data: presets/frameworks.json).

A runs CSV row names its stack in the ``framework`` column; a blank field of the row takes that
stack's default, and the row records every default it took (``meshplan validate --json`` lists
them), so no row is silently a GPT-style fp16 model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GPUSpec
from meshplan.spec.training import Precision, Recipe

UNSTATED = "unstated"
"""The entry used when the row names no framework."""


@dataclass(frozen=True, kw_only=True)
class FrameworkDefaults:
    """Defaults of one training stack for the fields a row leaves blank."""

    name: str
    architecture: str | None
    """'gpt': a model given only by its dimensions is GPT-style (LayerNorm, learned positions,
    biases, tied embeddings, FFN 4h GELU). None: the row must name a preset (model_aliases.json)."""
    precision: Precision
    fp8_recipes: tuple[Recipe, ...]
    """The fp8 recipe of an fp8 row: the first one the GPU runs."""
    zero: int
    """0 DDP, 1 distributed optimizer (ZeRO-1 over the data-parallel ranks), ..."""
    sequence_parallel_with_tp: bool
    recompute: str
    fused_attention: bool
    dropout: bool
    embedding_loss_stages: bool
    """With more (virtual) pipeline stages than layers, the embedding and the loss take one
    stage slot each (``plan.embedding_loss_split``); False: such a row is not buildable."""
    expert_tensor_parallel: int | None
    """etp of MoE layers when the row does not say (None: as tp, ``ParallelDims.etp`` = 0)."""
    stack: str
    """The calibration the stack's runs are estimated with (``cost.calibration`` stacks)."""
    calibration: dict[str, Any]
    """Mechanisms of this version of the stack that differ from the stack's (Calibration fields)."""
    source: str

    def fp8_recipe(self, gpu: GPUSpec) -> Recipe:
        for r in self.fp8_recipes:
            if not r.block_scaled or r.value in gpu.block_scaled_recipes:
                return r
        raise MeshplanError(f"{self.name}: none of its fp8 recipes "
                            f"({', '.join(r.value for r in self.fp8_recipes)}) runs on {gpu.name}")

    @property
    def settings(self) -> dict[str, Any]:
        """The calibration fields that describe the stack's kernels (Calibration names)."""
        return {"fused_attention": self.fused_attention, "dropout": self.dropout, **self.calibration}


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("meshplan.spec").joinpath("presets/frameworks.json").read_text()
    return json.loads(text)["frameworks"]


def framework_names() -> list[str]:
    return sorted(_data())


def framework_defaults(name: str | None) -> FrameworkDefaults:
    """Defaults of the stack ``name`` (blank: ``unstated``); MeshplanError for an unknown one."""
    key = (name or "").strip().lower() or UNSTATED
    data = _data()
    if key not in data:
        raise MeshplanError(f"no defaults known for framework {name!r}; known: {', '.join(sorted(data))}")
    e = data[key]
    return FrameworkDefaults(
        name=key, architecture=e["architecture"], precision=Precision(e["precision"]),
        fp8_recipes=tuple(Recipe(r) for r in e["fp8_recipes"]), zero=int(e["zero"]),
        sequence_parallel_with_tp=bool(e["sequence_parallel_with_tp"]), recompute=e["recompute"],
        fused_attention=bool(e["fused_attention"]), dropout=bool(e["dropout"]),
        embedding_loss_stages=bool(e.get("embedding_loss_stages", False)),
        expert_tensor_parallel=e.get("expert_tensor_parallel"), stack=e["stack"],
        calibration=dict(e.get("calibration", {})), source=e["source"])
