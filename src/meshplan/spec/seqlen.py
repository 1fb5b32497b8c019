"""A distribution of document lengths (tokens): what a dataset's documents look like before packing.

Read from one of three plain-text formats (docs/data-aware.md):

* a histogram CSV: a header ``length,count`` then one ``length,count`` row per length;
* a sample of lengths: one positive integer per line (an optional first line ``length``);
* JSON lines: one object per document with an integer ``"length"`` field.

Stored as a histogram (sorted distinct lengths and their counts), JSON-ready and hashable, so a
Job file carries it and the cost model can key precomputed scalars on it. Pure NumPy.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count
from meshplan.textfile import read_text_file

LENGTH_FIELD = "length"
"""Column of a histogram / sample file and key of a JSON-lines record holding a document's length."""
COUNT_FIELD = "count"
"""Column of a histogram file holding how many documents have that length."""
WHAT = "sequence-length distribution (histogram CSV, lengths, or jsonl)"


class DocBalance(str, enum.Enum):
    """How the documents of a global batch reach the data-parallel ranks (cost/packing.py)."""

    STREAM = "stream"  # packed in data order, a contiguous block of sequences per rank
    BALANCED = "balanced"  # token- and attention-balanced (greedy, longest document first)
    IDEAL = "ideal"  # a bound, not an assignment: every rank the mean attention work (no straggler)


@dataclass(frozen=True)
class SeqLenDist:
    """Document lengths in tokens as a histogram: ``counts[i]`` documents of ``lengths[i]`` tokens."""

    lengths: tuple[int, ...]
    """Distinct document lengths, increasing."""
    counts: tuple[int, ...]
    """Documents of each length (positive)."""
    source: str = ""
    """Where it was read from (a file name), for display only."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths))
        object.__setattr__(self, "counts", tuple(self.counts))
        if not self.lengths:
            raise MeshplanError("a sequence-length distribution needs at least one document length")
        if len(self.lengths) != len(self.counts):
            raise MeshplanError(f"sequence-length distribution: {len(self.lengths)} lengths but "
                                f"{len(self.counts)} counts")
        for n in self.lengths:
            check_count("document length", n)
        for n in self.counts:
            check_count("document count", n)
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:])):
            raise MeshplanError("sequence-length distribution: lengths must be distinct and increasing")

    @property
    def num_documents(self) -> int:
        return int(sum(self.counts))

    @property
    def mean_length(self) -> float:
        lengths, counts = self.arrays()
        return float((lengths * counts).sum() / counts.sum())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, counts) as float64 arrays."""
        return np.asarray(self.lengths, dtype=np.float64), np.asarray(self.counts, dtype=np.float64)

    def sample(self, rng: np.random.Generator, num_tokens: int) -> np.ndarray:
        """Document lengths drawn i.i.d. from the histogram until they hold ``num_tokens`` tokens;
        the last one is cut so that they hold exactly ``num_tokens`` (an int64 array)."""
        counts = self.arrays()[1]
        p = counts / counts.sum()
        guess = int(1.25 * num_tokens / self.mean_length) + 16  # enough draws, most of the time
        out = np.zeros(0, dtype=np.int64)
        while out.sum() < num_tokens:
            more = rng.choice(np.asarray(self.lengths, dtype=np.int64), size=guess, p=p)
            out = np.concatenate([out, more])
        ends = np.cumsum(out)
        last = int(np.searchsorted(ends, num_tokens))  # first document reaching num_tokens
        out = out[: last + 1].copy()
        out[-1] -= int(ends[last] - num_tokens)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"lengths": list(self.lengths), "counts": list(self.counts), "source": self.source}

    @classmethod
    def from_dict(cls, data: Any) -> SeqLenDist:
        if not isinstance(data, dict) or set(data) - {"lengths", "counts", "source"} \
                or not {"lengths", "counts"} <= set(data):
            raise MeshplanError("seq_len_dist must be an object with 'lengths' and 'counts' lists")
        if not isinstance(data["lengths"], list) or not isinstance(data["counts"], list):
            raise MeshplanError("seq_len_dist: 'lengths' and 'counts' must be lists of integers")
        return cls(lengths=tuple(data["lengths"]), counts=tuple(data["counts"]),
                   source=str(data.get("source", "")))


def from_samples(lengths: list[int] | np.ndarray, source: str = "") -> SeqLenDist:
    """The histogram of a sample of document lengths."""
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    return SeqLenDist(lengths=tuple(int(v) for v in values), counts=tuple(int(c) for c in counts),
                      source=source)


def load_seq_len_dist(path: str | Path) -> SeqLenDist:
    """Read a histogram CSV, a one-length-per-line sample or a JSON-lines file (told apart by the
    first non-blank line: ``{`` starts JSON lines, a comma a histogram); one-line errors."""
    p = Path(path)
    text = read_text_file(p, what=WHAT, allow_empty=False)
    rows = [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    first = rows[0][1]
    try:
        if first.startswith("{"):
            return from_samples(_jsonl_lengths(rows), source=p.name)
        if "," in first:
            return _histogram(rows, p.name)
        return from_samples(_sample_lengths(rows), source=p.name)
    except MeshplanError as exc:
        raise MeshplanError(f"{p}: {exc}") from None


def _int(text: str, line: int, what: str, minimum: int = 1) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise MeshplanError(f"line {line}: {what} {text.strip()!r} is not an integer") from None
    try:
        return check_count(what, value, minimum=minimum)
    except MeshplanError as exc:
        raise MeshplanError(f"line {line}: {exc}") from None


def _histogram(rows: list[tuple[int, str]], source: str) -> SeqLenDist:
    header = [c.strip().lower() for c in rows[0][1].split(",")]
    if header != [LENGTH_FIELD, COUNT_FIELD]:
        raise MeshplanError(f"line {rows[0][0]}: a histogram starts with the header "
                            f"'{LENGTH_FIELD},{COUNT_FIELD}', got {rows[0][1]!r}")
    seen: dict[int, int] = {}
    pairs = []
    for line, row in rows[1:]:
        cells = row.split(",")
        if len(cells) != 2:
            raise MeshplanError(f"line {line}: expected 'length,count', got {row!r}")
        length = _int(cells[0], line, "document length")
        count = _int(cells[1], line, "document count", minimum=0)
        if length in seen:
            raise MeshplanError(f"line {line}: length {length} listed twice (first on line {seen[length]})")
        seen[length] = line
        if count:
            pairs.append((length, count))
    pairs.sort()
    if not pairs:
        raise MeshplanError("the histogram counts no documents")
    return SeqLenDist(lengths=tuple(n for n, _ in pairs), counts=tuple(c for _, c in pairs), source=source)


def _sample_lengths(rows: list[tuple[int, str]]) -> list[int]:
    if rows[0][1].lower() == LENGTH_FIELD:
        rows = rows[1:]
    if not rows:
        raise MeshplanError("no document lengths after the header")
    return [_int(row, line, "document length") for line, row in rows]


def _jsonl_lengths(rows: list[tuple[int, str]]) -> list[int]:
    out = []
    for line, row in rows:
        try:
            record = json.loads(row)
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"line {line}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or LENGTH_FIELD not in record:
            raise MeshplanError(f"line {line}: a JSON-lines record needs a {LENGTH_FIELD!r} field")
        value = record[LENGTH_FIELD]
        if not isinstance(value, int) or isinstance(value, bool):
            raise MeshplanError(f"line {line}: {LENGTH_FIELD} {value!r} is not an integer")
        out.append(_int(str(value), line, "document length"))
    return out
