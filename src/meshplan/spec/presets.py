"""Model presets (data in presets/models.json) and the one resolver the CLI uses."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json
from meshplan.spec.model import ModelSpec


@lru_cache(maxsize=1)
def _model_data() -> dict[str, Any]:
    return {k: v for k, v in shipped_json("meshplan.spec", "presets/models.json").items() if not k.startswith("_")}


def model_names() -> list[str]:
    return list(_model_data())


def model_preset(name: str) -> ModelSpec:
    data = _model_data()
    key = name.lower()
    if key not in data:
        raise MeshplanError(f"unknown model {name!r}; known: {', '.join(data)} (or a config.json path)")
    fields = {k: v for k, v in data[key].items() if not k.startswith("_")}  # "_source": citation
    return ModelSpec(name=key, **fields)


def resolve_model(name_or_path: str, overrides: dict[str, Any] | None = None) -> ModelSpec:
    """A preset name, or a path to a Hugging Face config.json (or a folder holding one)."""
    if not name_or_path.strip():
        raise MeshplanError("the model name is empty: give a preset (see `meshplan models`) or a config.json")
    p = Path(name_or_path)
    if p.suffix.lower() == ".json" or p.is_dir() or p.is_file():
        from meshplan.spec.hf import load_hf_config

        spec = load_hf_config(p)
    else:
        spec = model_preset(name_or_path)
    return spec.with_overrides(overrides) if overrides else spec
