"""Why is one plan faster than another: the gap between two estimates, term by term.

Both plans are costed by the same model, whose step time is a sum of named terms
(``TimeBreakdown.terms_s``: compute, recompute, exposed TP/CP/EP/PP/ZeRO/DP communication, host
overhead, bubble, optimizer); the difference of the step is the sum of the differences of the
terms, so the rows below add up to the gap exactly. Memory is shown beside it (not part of the sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshplan.cost.step import Estimate


@dataclass(frozen=True)
class TermDelta:
    """One term of the step: seconds in yours, in theirs, and theirs - yours."""

    term: str
    yours_s: float
    theirs_s: float

    @property
    def delta_s(self) -> float:
        return self.theirs_s - self.yours_s


@dataclass(frozen=True)
class Attribution:
    """The step-time gap between two plans, by term, plus their peak memory."""

    terms: tuple[TermDelta, ...]
    yours_memory_gib: float
    theirs_memory_gib: float

    @property
    def gap_s(self) -> float:
        return sum(t.delta_s for t in self.terms)

    def largest(self, count: int) -> tuple[TermDelta, ...]:
        """The ``count`` terms with the largest saving (most negative delta) first."""
        return tuple(sorted((t for t in self.terms if t.delta_s < 0), key=lambda t: t.delta_s)[:count])

    def reversed(self) -> "Attribution":
        """The same gap seen from the other plan (where yours is faster than theirs)."""
        return Attribution(terms=tuple(TermDelta(t.term, t.theirs_s, t.yours_s) for t in self.terms),
                           yours_memory_gib=self.theirs_memory_gib, theirs_memory_gib=self.yours_memory_gib)

    def explain(self, count: int = 3) -> str:
        """One line: where the other plan gains (e.g. "exposed TP -0.21 s, bubble -0.08 s")."""
        saved = self.largest(count)
        if not saved:
            return "no term is smaller in the other plan"
        return ", ".join(f"{t.term} {t.delta_s:+.3f} s" for t in saved)

    def to_dict(self) -> dict[str, object]:
        return {"terms": [{"term": t.term, "yours_s": t.yours_s, "theirs_s": t.theirs_s, "delta_s": t.delta_s}
                          for t in self.terms],
                "gap_s": self.gap_s, "memory_gib": {"yours": self.yours_memory_gib,
                                                    "theirs": self.theirs_memory_gib,
                                                    "delta": self.theirs_memory_gib - self.yours_memory_gib},
                "explain": self.explain()}


def attribute(yours: "Estimate", theirs: "Estimate") -> Attribution:
    """Split ``theirs.step - yours.step`` over the named terms of the two estimates."""
    a, b = yours.time.terms_s(), theirs.time.terms_s()
    return Attribution(terms=tuple(TermDelta(k, a[k], b[k]) for k in a),
                       yours_memory_gib=yours.peak_memory_gib, theirs_memory_gib=theirs.peak_memory_gib)


def attribution_table(att: Attribution, title: str, yours: str = "yours", theirs: str = "recommended"):
    """A rich table: per term, yours / theirs / delta in seconds, then memory; zero rows left out."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("term", f"{yours} s", f"{theirs} s", "delta s"):
        t.add_column(col, justify="left" if col == "term" else "right")
    for d in att.terms:
        if d.yours_s == 0.0 and d.theirs_s == 0.0:
            continue
        t.add_row(d.term, f"{d.yours_s:.3f}", f"{d.theirs_s:.3f}", f"{d.delta_s:+.3f}")
    t.add_row("step", f"{sum(d.yours_s for d in att.terms):.3f}", f"{sum(d.theirs_s for d in att.terms):.3f}",
              f"{att.gap_s:+.3f}", style="bold")
    t.add_row("peak memory (GiB)", f"{att.yours_memory_gib:.1f}", f"{att.theirs_memory_gib:.1f}",
              f"{att.theirs_memory_gib - att.yours_memory_gib:+.1f}")
    return t
