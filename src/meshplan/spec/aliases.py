"""Model names as published runs write them -> preset names (data: presets/model_aliases.json).

'LLAMA3_8B' (Megatron-Bridge), 'Llama-3-8B' (a paper), 'meta-llama/Meta-Llama-3-8B' (a Hugging
Face id) and 'llama3 8b' are one key (``alias_key``); the table maps keys to presets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json


@dataclass(frozen=True)
class Alias:
    preset: str
    """Name in models.json (which may not exist on this build: the caller says so)."""
    note: str = ""
    """What the published name adds that the preset does not model."""
    moe_capacity_factor: float | None = None
    """The run's expert capacity (TrainingSpec.moe_capacity_factor) where the name says it dropped
    tokens ('(tokendrop)'); None: dropless."""
    frameworks: tuple[str, ...] = ()
    """The frameworks (frameworks.json names) whose rows mean the preset by this name; () every
    framework. 'GPT3-175B' of a NeMo table is NeMo's GPT-3 config, while a Megatron-LM 2020-22 row
    of the same name keeps its own dimensions (its padded vocabulary)."""


def normalise(name: str) -> str:
    """Lower case, runs of spaces / '_' / '-' folded into one space: 'LLAMA3_70B' ~ 'llama3 70b'."""
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


@lru_cache(maxsize=1)
def _data() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", "presets/model_aliases.json")


_HF_ORG = re.compile(r"^[\w.\-]+/(?=[\w.\-]+$)")
"""The organisation of a Hugging Face id ('meta-llama/' of 'meta-llama/Llama-3.1-8B'); a name with
spaces is no id ('DeepSeekV3 (w/o MTP)' keeps its '/')."""


def alias_key(name: str) -> str:
    """The key a model name is matched on: the Hugging Face organisation ('meta-llama/') and the
    table's ignored leading / trailing words dropped, then no separators at all:
    'meta-llama/Meta-Llama-3-8B-Instruct' -> 'llama38b' == alias_key('LLAMA3_8B')."""
    words = normalise(_HF_ORG.sub("", name.strip())).split(" ")
    data = _data()
    while len(words) > 1 and words[0] in data["ignored_prefix_words"]:
        words = words[1:]
    while len(words) > 1 and words[-1] in data["ignored_suffix_words"]:
        words = words[:-1]
    return "".join(words)


@lru_cache(maxsize=1)
def _table() -> dict[str, Alias]:
    table: dict[str, Alias] = {}
    for k, v in _data()["aliases"].items():
        key, alias = alias_key(k), Alias(**{**v, "frameworks": tuple(v.get("frameworks", ()))})
        if table.get(key, alias) != alias:  # two spellings of one key must agree (a data error)
            raise MeshplanError(f"model_aliases.json: {k!r} and another name share the key {key!r}")
        table[key] = alias
    return table


def resolve_alias(name: str) -> Alias | None:
    """The alias entry of a published model name, or None when the table does not have it."""
    return _table().get(alias_key(name))
