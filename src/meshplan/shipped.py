"""The data files shipped inside meshplan's packages (presets and tables under ``meshplan.spec``,
published runs, recipes and layouts under ``meshplan.data``): where one lies, and a JSON one read.

Callers keep their own ``lru_cache`` around what they build from a file (read once per process).
A file given by the user is read through ``meshplan.textfile`` / ``meshplan.jsonfile`` instead,
which turn its faults into one-line errors; a shipped file is part of the package."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping


def shipped_path(package: str, name: str) -> Path:
    """The file ``name`` shipped inside ``package`` (``shipped_path("meshplan.data", "bridge_layouts.csv")``)."""
    return Path(str(resources.files(package).joinpath(name)))


def shipped_text(package: str, name: str) -> str:
    """The text of the shipped file ``name`` of ``package``."""
    return resources.files(package).joinpath(name).read_text()


def shipped_json(package: str, name: str) -> Mapping[str, Any]:
    """The shipped JSON file ``name`` of ``package``, parsed, its top level read-only."""
    return MappingProxyType(json.loads(shipped_text(package, name)))
