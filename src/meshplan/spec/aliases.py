"""Model names as published runs write them -> preset names (data: presets/model_aliases.json)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class Alias:
    preset: str
    """Name in models.json (which may not exist on this build: the caller says so)."""
    note: str = ""
    """What the published name adds that the preset does not model."""


def normalise(name: str) -> str:
    """Lower case, runs of spaces / '_' / '-' folded into one space: 'LLAMA3_70B' ~ 'llama3 70b'."""
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


@lru_cache(maxsize=1)
def _table() -> dict[str, Alias]:
    text = resources.files("meshplan.spec").joinpath("presets/model_aliases.json").read_text()
    return {normalise(k): Alias(**v) for k, v in json.loads(text)["aliases"].items()}


def resolve_alias(name: str) -> Alias | None:
    """The alias entry of a published model name, or None when the table does not have it."""
    return _table().get(normalise(name))
