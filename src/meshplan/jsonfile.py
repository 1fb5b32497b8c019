"""Reading the JSON files meshplan writes (plans, checkpoint metadata, hardware profiles): one
place that turns a missing or malformed file into a one-line MeshplanError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar

from meshplan.errors import MeshplanError

T = TypeVar("T")


def load_json_file(path: str | Path, parse: Callable[[Any], T], *, missing: str) -> T:
    """``parse(json.load(path))``; every error is prefixed with the path. ``missing`` says what
    a file that is not there means ("no such plan file")."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise MeshplanError(f"{p}: {missing}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MeshplanError(f"{p}: not valid JSON ({str(exc).splitlines()[0]})") from None
    try:
        return parse(data)
    except MeshplanError as exc:
        raise MeshplanError(f"{p}: {exc}") from None
