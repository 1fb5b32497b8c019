"""How a MoE router spreads tokens over the experts: the expert-load description of a run.

Two sources, one type:

* a skew parameter: expert ``e`` (0-based) receives a share proportional to ``(e + 1) ** -s``, a
  Zipf law of exponent ``s`` (0: uniform). The hottest experts are the lowest ids, so experts
  placed contiguously (ep rank ``r`` holding ids ``[r*E/ep, (r+1)*E/ep)``, the runtime's and
  Megatron-Core's layout) put the hottest experts on one rank: the case placement must fix.
* a routing log the runtime writes (``meshplan train --expert-load-log``): per step, per MoE
  layer, the token copies each expert received over the whole run (summed over data- and
  expert-parallel ranks). Format: JSON lines, a header object then one object per step::

      {"format": "meshplan-expert-load", "version": 1, "num_experts": 8, "top_k": 2, "moe_layers": 2}
      {"step": 1, "counts": [[12, 3, ...8 ints], [...layer 2...]]}

The cost model reads shares (counts over their sum), never absolute counts, so a log taken at
a small batch describes a larger one; a small batch's sampling noise shows as extra imbalance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.numbers import MAX_COUNT
from meshplan.textfile import read_text_file

LOG_FORMAT = "meshplan-expert-load"
LOG_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ExpertLoad:
    """Per step, per MoE layer, per expert routed token copies (a log), or a Zipf exponent."""

    zipf_exponent: float | None = None
    """s of the Zipf skew (share of expert e ~ (e + 1)^-s); None when ``counts`` describe the load."""
    counts: tuple[tuple[tuple[int, ...], ...], ...] = ()
    """[step][moe layer][expert] token copies routed to each expert (a routing log)."""
    source: str = ""
    """Where the description came from (file name or ``zipf``), for reports."""

    def __post_init__(self) -> None:
        if (self.zipf_exponent is None) == (not self.counts):
            raise MeshplanError("an expert load is either a Zipf exponent or a routing log's counts, exactly one")
        if self.zipf_exponent is not None:
            s = self.zipf_exponent
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
                raise MeshplanError(f"expert skew (Zipf exponent) must be a number >= 0, got {s!r}")
            return
        object.__setattr__(self, "counts", tuple(tuple(tuple(layer) for layer in step) for step in self.counts))
        _check_counts(np.asarray(self.counts, dtype=object), what="expert load counts")

    @property
    def num_experts(self) -> int | None:
        """Experts the log counts (None for a Zipf law, which fits any count)."""
        return len(self.counts[0][0]) if self.counts else None

    def shares(self, num_experts: int) -> np.ndarray:
        """(steps, layers, E) share of each expert in its step and layer's routed copies."""
        if self.zipf_exponent is not None:
            w = np.arange(1, num_experts + 1, dtype=float) ** -float(self.zipf_exponent)
            return (w / w.sum())[None, None, :]
        if self.num_experts != num_experts:
            raise MeshplanError(f"the expert load ({self.source or 'routing log'}) counts {self.num_experts} "
                                f"experts, the model has {num_experts}")
        c = np.asarray(self.counts, dtype=float)
        return c / c.sum(axis=-1, keepdims=True)

    def imbalance(self) -> np.ndarray:
        """(steps, layers) busiest expert over the mean: the measured imbalance (max/mean)."""
        c = np.asarray(self.counts, dtype=float)
        return c.max(axis=-1) / c.mean(axis=-1)

    def describe(self) -> str:
        if self.zipf_exponent is not None:
            return f"zipf s={self.zipf_exponent:g}"
        return f"{self.source or 'routing log'} ({len(self.counts)} steps x {len(self.counts[0])} layers)"

    def to_dict(self) -> dict[str, Any]:
        if self.zipf_exponent is not None:
            return {"zipf_exponent": self.zipf_exponent}
        return {"counts": [[list(layer) for layer in step] for step in self.counts], "source": self.source}

    @classmethod
    def from_dict(cls, data: Any) -> "ExpertLoad":
        if not isinstance(data, dict):
            raise MeshplanError(f"expert_load must be an object, got {type(data).__name__}")
        extra = set(data) - {"zipf_exponent", "counts", "source"}
        if extra:
            raise MeshplanError(f"unknown expert_load field(s): {', '.join(sorted(extra))}")
        counts = data.get("counts", ())
        if not isinstance(counts, list | tuple):
            raise MeshplanError("expert_load counts must be a list of steps")
        return cls(zipf_exponent=data.get("zipf_exponent"), counts=tuple(counts), source=str(data.get("source", "")))


def zipf_load(exponent: float) -> ExpertLoad:
    """The skew-parameter description (``--expert-skew``)."""
    return ExpertLoad(zipf_exponent=exponent, source="zipf")


def _check_counts(c: np.ndarray, *, what: str) -> None:
    """counts: [step][layer][expert] non-negative integers, every (step, layer) with a token."""
    if c.ndim != 3 or 0 in c.shape:
        raise MeshplanError(f"{what}: expected [step][moe layer][expert] lists of the same lengths, "
                            f"got an array of shape {c.shape}")
    flat = c.reshape(-1)
    bad = [v for v in flat if not _is_count(v)]
    if bad:
        raise MeshplanError(f"{what}: token counts must be non-negative integers, got {bad[0]!r} "
                            f"(at most {MAX_COUNT:,})")
    if c.shape[-1] < 2:
        raise MeshplanError(f"{what}: a MoE layer needs at least 2 experts, the log has {c.shape[-1]}")
    empty = np.argwhere(c.astype(np.int64).sum(axis=-1) == 0)
    if len(empty):
        step, layer = (int(v) for v in empty[0])
        raise MeshplanError(f"{what}: step {step + 1}, moe layer {layer} routed no token")


def _is_count(v: Any) -> bool:
    """A token count as the log holds it: an int (not a bool) in [0, MAX_COUNT], so that a step's
    sum stays exact in the int64 array the shares are taken from."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def read_expert_load(path: str | Path) -> ExpertLoad:
    """A routing log (module docstring); every defect is one MeshplanError naming the file and line."""
    p = Path(path)
    lines = [ln for ln in read_text_file(p, what="expert-load log").splitlines()]
    rows = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if not rows:
        raise MeshplanError(f"{p}: empty expert-load log (expected a header line, then one line per step)")
    parsed = []
    for n, ln in rows:
        try:
            parsed.append((n, json.loads(ln)))
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"{p}: line {n}: not JSON ({exc.msg})") from None
    (n0, head), steps = parsed[0], parsed[1:]
    if not isinstance(head, dict) or head.get("format") != LOG_FORMAT:
        raise MeshplanError(f"{p}: line {n0}: not an expert-load log (the header needs \"format\": \"{LOG_FORMAT}\")")
    if head.get("version") != LOG_VERSION:
        raise MeshplanError(f"{p}: line {n0}: expert-load log version {head.get('version')!r}, "
                            f"this meshplan reads version {LOG_VERSION}")
    E, layers = head.get("num_experts"), head.get("moe_layers")
    for name, v in (("num_experts", E), ("moe_layers", layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MeshplanError(f"{p}: line {n0}: header {name} must be a positive integer, got {v!r}")
    if not steps:
        raise MeshplanError(f"{p}: no step lines after the header (the run logged no step)")
    counts = []
    for n, rec in steps:
        c = rec.get("counts") if isinstance(rec, dict) else None
        if not isinstance(c, list) or len(c) != layers or not all(isinstance(r, list) and len(r) == E for r in c):
            raise MeshplanError(f"{p}: line {n}: \"counts\" must be {layers} lists of {E} token counts "
                                "(one per moe layer)")
        try:
            _check_counts(np.asarray([c], dtype=object), what="counts")
        except MeshplanError as exc:
            raise MeshplanError(f"{p}: line {n}: {str(exc).removeprefix('counts: ')}") from None
        counts.append(c)
    return ExpertLoad(counts=tuple(counts), source=p.name)


def log_header(num_experts: int, top_k: int, moe_layers: int) -> dict[str, Any]:
    """The routing log's first line (written by the runtime)."""
    return {"format": LOG_FORMAT, "version": LOG_VERSION, "num_experts": num_experts, "top_k": top_k,
            "moe_layers": moe_layers}
