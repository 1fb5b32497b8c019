"""Reading the JSON files meshplan writes (plans, checkpoint metadata, hardware profiles): one
place that turns a missing or malformed file into a one-line MeshplanError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar

from meshplan.errors import MeshplanError
from meshplan.textfile import read_text_file

T = TypeVar("T")


def load_json_file(path: str | Path, parse: Callable[[Any], T], *, missing: str, what: str = "JSON file") -> T:
    """``parse(json.load(path))``; every error is prefixed with the path. ``missing`` says what
    a file that is not there means ("no such plan file"); ``what`` names the file for the other
    failures (a directory, a binary file)."""
    p = Path(path)
    text = read_text_file(path, what=what, missing=missing)
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{p}: not valid JSON ({str(exc).splitlines()[0]})") from None
    except ValueError as exc:  # NaN / Infinity, refused by _reject_constant
        raise MeshplanError(f"{p}: not valid JSON ({exc})") from None
    try:
        return parse(data)
    except MeshplanError as exc:
        raise MeshplanError(f"{p}: {exc}") from None


def _reject_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity, which strict JSON has not: a number read from a file
    must be finite."""
    raise ValueError(f"{name} is not a finite number")
