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
        return StageTable(self.layer_time_s[idx], self.recompute_time_s[idx], self.layer_static_bytes[idx],
                          self.layer_act_bytes[idx], self.layer_act_recomputed_bytes[idx],
                          self.rank_time_s[idx], self.rank_bytes[idx], self.inflight[idx],
                          self.allow_recompute[idx], self.num_layers,
                          self.chunks if np.ndim(self.chunks) == 0 else self.chunks[idx],
                          self.jump()[idx])

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
