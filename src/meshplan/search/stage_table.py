"""The affine per-rank cost table of the stage search and the points it walks
(:mod:`meshplan.search.stages` states the model: t_s(n, r), m_s(n, r))."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

_REL = 1e-12
"""Relative slack when comparing floats that were computed along different paths."""


@dataclass(frozen=True)
class StageTable:
    """Affine per-rank costs for C global configurations with the same ``p`` and ``v``."""

    layer_time_s: np.ndarray  # (C,) a
    recompute_time_s: np.ndarray  # (C,) b
    layer_static_bytes: np.ndarray  # (C,) c
    layer_act_bytes: np.ndarray  # (C,) d
    layer_act_recomputed_bytes: np.ndarray  # (C,) g (<= d)
    rank_time_s: np.ndarray  # (C, p) e
    rank_bytes: np.ndarray  # (C, p) f
    inflight: np.ndarray  # (C, p) k
    allow_recompute: np.ndarray  # (C,) bool: recompute policy is not 'none'
    num_layers: int  # L
    chunks: int | np.ndarray = 1  # v: layers per rank at least v (one int, or (C,) per config)
    recompute_jump_bytes: np.ndarray | None = None
    """(C,) memory added once a rank recomputes any layer (full recompute rematerialises one
    layer's activations during its backward); None means 0."""
    layer_tail_s: np.ndarray | None = None
    """(C,) the part of ``layer_time_s`` that is a per-step tail y (data-parallel and optimizer
    time per layer over the pipeline factor alpha): the step is alpha (max_s (t_s - y_s) +
    max_s y_s), which ``t_s`` folded (its max) bounds from below. None: no tail (the folded
    time is the objective)."""
    rank_tail_s: np.ndarray | None = None
    """(C, p) the part of ``rank_time_s`` that is the per-step tail (see ``layer_tail_s``)."""
    max_layers: np.ndarray | None = None
    """(C, p) most layers each rank may hold (the walk of :mod:`meshplan.search.stage_tails`
    caps the tails so); None: L - (p - 1) v."""

    def chunk_array(self) -> np.ndarray:
        """v per config, (C,) int (read-only; built once per table)."""
        return self._chunk_array[0]

    def min_chunks(self) -> int:
        """The least v of the table (1 when it has no config)."""
        return self._chunk_array[1]

    def uniform_chunks(self) -> bool:
        """Whether every config has the same v (then no grid needs :func:`_mask_grid`)."""
        return self._chunk_array[2]

    @cached_property
    def _chunk_array(self) -> tuple[np.ndarray, int, bool]:
        # one cached entry: the walk asks for these at every point of every table it takes
        v = np.broadcast_to(np.asarray(self.chunks, dtype=np.int64), (self.num_configs,))
        if v.size == 0:
            return v, 1, True
        lo = int(v.min())
        return v, lo, np.ndim(self.chunks) == 0 or lo == int(v.max())

    def jump(self) -> np.ndarray:
        if self.recompute_jump_bytes is None:
            return np.zeros(self.num_configs)
        return self.recompute_jump_bytes

    @property
    def num_configs(self) -> int:
        return int(self.layer_time_s.size)

    @property
    def num_ranks(self) -> int:
        return int(self.rank_time_s.shape[1])

    def take(self, idx: np.ndarray) -> "StageTable":
        opt = lambda x: None if x is None else x[idx]  # noqa: E731
        return StageTable(self.layer_time_s[idx], self.recompute_time_s[idx], self.layer_static_bytes[idx],
                          self.layer_act_bytes[idx], self.layer_act_recomputed_bytes[idx],
                          self.rank_time_s[idx], self.rank_bytes[idx], self.inflight[idx],
                          self.allow_recompute[idx], self.num_layers,
                          self.chunks if np.ndim(self.chunks) == 0 else self.chunks[idx],
                          self.jump()[idx], opt(self.layer_tail_s), opt(self.rank_tail_s), opt(self.max_layers))

    def has_tails(self) -> bool:
        """Whether the step's objective is not the folded time (pp > 1 with a tail)."""
        return self.layer_tail_s is not None and self.num_ranks > 1

    def tails(self, n: np.ndarray) -> np.ndarray:
        """(C, p) per-step tail y_s of n layers per rank (0 without tails)."""
        if self.layer_tail_s is None:
            return np.zeros(np.shape(n))
        return n * self.layer_tail_s[:, None] + self.rank_tail_s

    def step_time_s(self, n: np.ndarray, r: np.ndarray) -> np.ndarray:
        """(C,) the objective of splits (n, r): max_s (t_s - y_s) + max_s y_s (the folded
        max_s t_s without tails)."""
        t, _ = self.rank_costs(n, r)
        if self.layer_tail_s is None:
            return t.max(axis=1)
        y = self.tails(n)
        return (t - y).max(axis=1) + y.max(axis=1)

    # ---- the per-rank cost of a concrete choice ------------------------------------------
    def rank_costs(self, n: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time, memory) per rank for layer counts n and recomputed counts r, both (C, p)."""
        a, b, c, d, g = (x[:, None] for x in (self.layer_time_s, self.recompute_time_s,
                                              self.layer_static_bytes, self.layer_act_bytes,
                                              self.layer_act_recomputed_bytes))
        t = n * a + r * b + self.rank_time_s
        m = n * c + self.inflight * ((n - r) * d + r * g) + self.rank_bytes
        return t, m + np.where(r > 0, self.jump()[:, None], 0.0)


@dataclass(frozen=True)
class StagePoints:
    """Frontier points of many configs: ``config`` indexes the StageTable rows."""

    config: np.ndarray  # (P,)
    max_time_s: np.ndarray  # (P,) slowest rank per micro-batch
    peak_bytes: np.ndarray  # (P,) most loaded rank
    layers: np.ndarray  # (P, p) n_s
    recomputed: np.ndarray  # (P, p) r_s


def _empty_points(p: int) -> StagePoints:
    z = np.empty(0)
    return StagePoints(np.empty(0, dtype=np.int64), z, z, np.empty((0, p), np.int64), np.empty((0, p), np.int64))
