"""Documented corrections to the published runs, kept as data (``meshplan/data/corrections.csv``).

The shared copies of the published runs (``runs_calibration.csv``, ``runs_megatron_bridge.csv``)
keep the cells as their sources print them; where a source contradicts itself or leaves out what
another source gives, a correction names the row, the column, the value as published, the
corrected value and its evidence. A correction applies to a row only when the row's id AND its
identifying columns (source, model, gpu, layout) are those the correction was written for, and the
cell still holds the value as published: a file with its own row 12, or a row already corrected,
is left as it is. The shipped CSVs are the shared ones with every correction applied (a test holds
that while the shared data is reachable).

A corrected row's ``notes`` say which cells changed (``CORRECTED_NOTE``), so the row reads right
on its own; the evidence stays in corrections.csv.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.shipped import shipped_text
from meshplan.textfile import csv_records

CORRECTIONS_FILE = "corrections.csv"
"""The shipped corrections, in the package ``meshplan.data``."""

IDENTIFYING_COLUMNS: tuple[str, ...] = ("source", "model", "gpu", "num_gpus", "global_batch_size", "tp", "pp", "dp")
"""The columns that single out the run a correction was written for, besides its id (none of them
is corrected by any entry: the value as published of the corrected cell is checked on its own)."""

CORRECTION_COLUMNS: tuple[str, ...] = ("set", "id", *IDENTIFYING_COLUMNS, "column", "published", "corrected",
                                       "evidence")

CORRECTED_NOTE = " | corrected (meshplan data/corrections.csv): "
"""Appended to a corrected row's notes, then ``column published -> corrected`` per cell."""


@dataclass(frozen=True)
class Correction:
    set_name: str
    """The shipped set the row belongs to (``calibration``, ``megatron-bridge``): documentation and
    the shipped-copy check; matching is by id and identifying columns."""
    row_id: str
    identity: tuple[tuple[str, str], ...]
    """(column, value as the shared copy has it) for each of IDENTIFYING_COLUMNS."""
    column: str
    published: str
    corrected: str
    evidence: str

    def matches(self, row: dict[str, str]) -> bool:
        """Whether ``row`` is the run this correction was written for."""
        return _cell(row, "id") == self.row_id and all(_cell(row, k) == v for k, v in self.identity)

    def change(self) -> str:
        return f"{self.column} {self.published or 'blank'} -> {self.corrected or 'blank'}"

    def to_dict(self) -> dict[str, str]:
        return {"set": self.set_name, "id": self.row_id, "column": self.column, "published": self.published,
                "corrected": self.corrected, "evidence": self.evidence}


@dataclass(frozen=True)
class CorrectionReport:
    applied: tuple[Correction, ...] = ()
    not_applied: tuple[tuple[Correction, str], ...] = ()
    """Corrections whose row is in the file but whose cell holds neither the value as published
    nor the corrected one: the file differs from the copy the correction was written for."""
    as_published: bool = False

    def to_dict(self) -> dict:
        return {"file": f"meshplan/data/{CORRECTIONS_FILE}", "as_published": self.as_published,
                "applied": [c.to_dict() for c in self.applied],
                "not_applied": [{**c.to_dict(), "reason": why} for c, why in self.not_applied]}


def _cell(row: dict[str, str], key: str) -> str:
    return (row.get(key) or "").strip()


def parse_corrections(text: str, where: str) -> tuple[Correction, ...]:
    return tuple(
        Correction(set_name=r["set"].strip(), row_id=r["id"].strip(),
                   identity=tuple((k, (r[k] or "").strip()) for k in IDENTIFYING_COLUMNS),
                   column=r["column"].strip(), published=(r["published"] or "").strip(),
                   corrected=(r["corrected"] or "").strip(), evidence=r["evidence"].strip())
        for r in csv_records(text, where, required=CORRECTION_COLUMNS, what="corrections CSV"))


@lru_cache(maxsize=1)
def shipped_corrections() -> tuple[Correction, ...]:
    return parse_corrections(shipped_text("meshplan.data", CORRECTIONS_FILE), CORRECTIONS_FILE)


def apply_corrections(rows: list[dict[str, str]], corrections: tuple[Correction, ...]
                      ) -> tuple[list[dict[str, str]], CorrectionReport]:
    """``rows`` with each correction that matches a row applied (new dicts; a column the file lacks,
    e.g. ``system``, is added to the corrected rows), and what was applied."""
    applied: list[Correction] = []
    not_applied: list[tuple[Correction, str]] = []
    out = []
    for row in rows:
        mine = [c for c in corrections if c.matches(row)]
        done = []
        new = dict(row)
        for c in mine:
            cell = _cell(row, c.column)
            if cell == c.published:
                new[c.column] = c.corrected
                done.append(c)
            elif cell != c.corrected:
                why = f"the cell holds {cell or 'blank'!r}, the correction was written for {c.published or 'blank'!r}"
                not_applied.append((c, why))
        if done:
            new["notes"] = (row.get("notes") or "") + CORRECTED_NOTE + "; ".join(c.change() for c in done)
            applied += done
        out.append(new)
    return out, CorrectionReport(applied=tuple(applied), not_applied=tuple(not_applied))
