"""What a published run leaves unsaid, per training stack (data: presets/frameworks.json).

A runs CSV row names its stack in the ``framework`` column; a blank field of the row takes that
stack's default, and the row records every default it took (``meshplan validate --json`` lists
them), so no row is silently a GPT-style fp16 model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json
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
    pipeline_split: str
    """How the stack splits layers over pipeline stages when the run names no split: 'even'
    (``plan.even_split``; Megatron-LM's default), 'torchtitan-2024' (torchtitan's
    ``generate_split_points`` of 2024-10 to 2025-07, ``plan.torchtitan_split_2024``) or
    'torchtitan' (its ``generate_llm_fqn_per_model_part`` since, ``plan.torchtitan_split``)."""
    expert_tensor_parallel: int | None
    """etp of MoE layers when the row does not say (None: as tp, ``ParallelDims.etp`` = 0)."""
    stack: str
    """The calibration the stack's runs are estimated with (``cost.calibration`` stacks)."""
    calibration: dict[str, Any]
    """Mechanisms of this version of the stack that differ from the stack's (Calibration fields)."""
    source: str
    read_as: str = ""
    """How the row's name was read when it is not the entry's own ('' otherwise), for ``assumed``."""

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
def _file() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", "presets/frameworks.json")


def _data() -> dict[str, Any]:
    return _file()["frameworks"]


def framework_names() -> list[str]:
    return sorted(_data())


_VERSION = re.compile(r"-+v?\d+(\.\d+)*[a-z0-9.+]*$")
"""A trailing release number: '-0.9', '-v0.14.4', '-2.0rc1', '-25.09'."""


def framework_key(name: str) -> str:
    """Lower case, runs of spaces, '_' and '-' folded into one '-': 'Megatron_LM 0.9' -> 'megatron-lm-0.9'."""
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


def resolve_framework(name: str | None) -> str:
    """The frameworks.json entry a row's ``framework`` names: the entry or an alias of it, as
    written or without a trailing version (blank: ``unstated``); MeshplanError for an unknown one."""
    key = framework_key(name or "") or UNSTATED
    entries, aliases = _data(), _file()["aliases"]
    candidate = key
    while True:  # as written, then without one trailing release number at a time ('torchtitan-2025-03')
        if candidate in entries:
            return candidate
        if candidate in aliases:
            return aliases[candidate]
        shorter = _VERSION.sub("", candidate)
        if shorter in ("", candidate):
            break
        candidate = shorter
    raise MeshplanError(f"no defaults known for framework {name!r}; known: {', '.join(sorted(entries))} "
                        "(or an alias of one: spec/presets/frameworks.json)")


def _entry(key: str) -> Mapping[str, Any]:
    """An entry as written, or (``extends``) a dated version of another entry: the other's fields
    with its own over them, the calibration fields merged, both sources."""
    e = _data()[key]
    base_key = e.get("extends")
    if base_key is None:
        return e
    if base_key not in _data() or "extends" in _data()[base_key]:
        raise MeshplanError(f"frameworks.json {key}: extends {base_key!r}, which is not an entry of its own")
    base = _data()[base_key]
    return {**base, **e, "calibration": {**base.get("calibration", {}), **e.get("calibration", {})},
            "source": f"{base['source']}; {e['source']}"}


PIPELINE_SPLITS = ("even", "torchtitan-2024", "torchtitan")


def _pipeline_split(value: Any, key: str) -> str:
    if value not in PIPELINE_SPLITS:
        raise MeshplanError(f"frameworks.json {key}: pipeline_split {value!r} is not one of {', '.join(PIPELINE_SPLITS)}")
    return str(value)


def framework_defaults(name: str | None) -> FrameworkDefaults:
    """Defaults of the stack ``name`` (blank: ``unstated``); MeshplanError for an unknown one."""
    key = resolve_framework(name)
    e = _entry(key)
    written = framework_key(name or "")
    read_as = f"framework: {name.strip()!r} read as {key}" if written and written != key else ""
    return FrameworkDefaults(
        name=key, architecture=e["architecture"], precision=Precision(e["precision"]),
        fp8_recipes=tuple(Recipe(r) for r in e["fp8_recipes"]), zero=int(e["zero"]),
        sequence_parallel_with_tp=bool(e["sequence_parallel_with_tp"]), recompute=e["recompute"],
        fused_attention=bool(e["fused_attention"]), dropout=bool(e["dropout"]),
        embedding_loss_stages=bool(e.get("embedding_loss_stages", False)),
        pipeline_split=_pipeline_split(e.get("pipeline_split", "even"), key),
        expert_tensor_parallel=e.get("expert_tensor_parallel"), stack=e["stack"],
        calibration=dict(e.get("calibration", {})), source=e["source"], read_as=read_as)
