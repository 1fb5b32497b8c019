"""The framework versions the exports are checked against: pyproject's ``frameworks`` extra is the
one place they are written (tests/frameworks/ assert the installed versions, the torchtitan
exporter targets its pin; bench/framework_versions.py prints them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pinned(dist: str) -> str:
    """The ``==`` version pyproject's ``frameworks`` extra pins ``dist`` to."""
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["frameworks"]
    pins = dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", req).groups() for req in extra)
    return pins[dist]
