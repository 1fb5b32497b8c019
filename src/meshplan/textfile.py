"""Reading the text files a user names (plans, cluster and model configs, CSVs, TOML, data):
one place that turns every way a path can fail into a one-line MeshplanError naming the file.

A directory, an unreadable file, a binary file, a file that is not UTF-8 and a missing file each
get their own sentence; callers only say what the file was meant to be.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from meshplan.errors import MeshplanError

BINARY_SNIFF_BYTES = 8192
"""Bytes read to tell a binary file from text: a NUL among them means binary (the heuristic of
git's ``buffer_is_binary`` and GNU grep, which look at the first 8000 / 32 KiB bytes)."""


def _path(path: str | Path, what: str) -> Path:
    """``path`` as a Path; an empty string (``--plan ''``) is refused here, before ``Path('')``
    turns it into the current folder."""
    if str(path) == "":
        raise MeshplanError(f"an empty path where a {what} was expected")
    return Path(path)


@contextmanager
def _one_line(p: Path, what: str, missing: str | None = None) -> Iterator[None]:
    """The OS's reasons a file cannot be read, as one MeshplanError naming the file."""
    try:
        yield
    except FileNotFoundError:
        raise MeshplanError(f"{p}: {missing or f'no such {what}'}") from None
    except IsADirectoryError:
        raise MeshplanError(f"{p}: is a directory, expected a {what}") from None
    except PermissionError:
        raise MeshplanError(f"{p}: permission denied (cannot read the {what})") from None
    except NotADirectoryError:
        raise MeshplanError(f"{p}: no such {what} (a parent of it is a file)") from None
    except OSError as exc:
        raise MeshplanError(f"{p}: cannot read the {what} ({exc.strerror or type(exc).__name__})") from None


def read_text_file(path: str | Path, *, what: str, missing: str | None = None, allow_empty: bool = True) -> str:
    """The UTF-8 text of ``path``. ``what`` names the expected file ("plan file", "runs CSV");
    ``missing`` replaces "no such {what}" for a file that is not there. Every failure is
    ``MeshplanError("{path}: ...")``."""
    p = _path(path, what)
    if p.exists() and not p.is_file() and not p.is_dir():  # /dev/zero, a FIFO: never ends
        raise MeshplanError(f"{p}: is not a regular file, expected a {what}")
    with _one_line(p, what, missing):
        raw = p.read_bytes()
    if b"\x00" in raw[:BINARY_SNIFF_BYTES]:
        raise MeshplanError(f"{p}: is a binary file, not a {what}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MeshplanError(f"{p}: is not UTF-8 text (byte {exc.start}), expected a {what}") from None
    if not allow_empty and not text.strip():
        raise MeshplanError(f"{p}: is empty, expected a {what}")
    return text


def csv_records(text: str, name: str, *, required: Sequence[str], what: str) -> Iterator[dict[str, str]]:
    """The rows of CSV ``text`` (from ``name``) as dicts by header, lazily: a caller's error on an
    early row comes before a CSV syntax error further down. A header without every ``required``
    column, or a malformed CSV, is ``MeshplanError("{name}: ...")``; ``what`` names the file
    ("runs CSV")."""
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise MeshplanError(f"{name}: not a {what}, missing column(s): {', '.join(missing)}")
        yield from reader
    except csv.Error as exc:
        raise MeshplanError(f"{name}: cannot read CSV: {exc}") from None


def check_text_file(path: str | Path, *, what: str) -> Path:
    """``path`` is a readable, non-empty text file, judged from its first bytes (for files too
    large to read twice, such as training data); the same sentences as read_text_file."""
    p = _path(path, what)
    with _one_line(p, what), p.open("rb") as fh:
        head = fh.read(BINARY_SNIFF_BYTES)
    if not head.strip():
        raise MeshplanError(f"{p}: is empty, expected a {what}")
    if b"\x00" in head:
        raise MeshplanError(f"{p}: is a binary file, not a {what}")
    return p


def check_writable(path: str | Path, *, what: str) -> Path:
    """``path`` can be created or replaced as a file: its folder exists and is a folder, and it is
    not itself a folder. Checked before long work (a search, a training run) so that the work is
    not lost to a bad output path; the write itself still reports its own failure."""
    p = _path(path, what)
    cannot = f"cannot write the {what} to {p}"
    if p.is_dir():
        raise MeshplanError(f"{cannot}: it is a directory")
    parent = p.parent
    if not parent.exists():
        raise MeshplanError(f"{cannot}: folder {parent} does not exist")
    if not parent.is_dir():
        raise MeshplanError(f"{cannot}: {parent} is not a folder")
    existed = p.exists()
    try:  # open it as the write will (permission bits do not tell root, /proc or a read-only mount)
        with p.open("a"):
            pass
    except OSError as exc:
        raise MeshplanError(f"{cannot}: {exc.strerror or type(exc).__name__}") from None
    if not existed:
        p.unlink(missing_ok=True)
    return p
