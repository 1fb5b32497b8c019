"""OSDP as a searched choice: groups kept gathered and operators split, on zero-3 configurations.

Keeping a group gathered buys back ZeRO-3's re-gathers with the group's whole weights in memory;
splitting the MLP buys ZeRO-3's gathered buffer down with smaller kernels; chunking the LM head
buys the logits down with a second head forward, at any ZeRO stage (:mod:`meshplan.cost.osdp`).
Each moves a configuration's point by a little, so a variant can reach the frontier only from a
configuration near it already, or one that memory holds back (over the budget and faster than the
fastest plan that fits): the search scores a small set of variants of those (``KEEP_CHOICES`` x
``SPLIT_CHOICES``, the keeps and MLP slices on zero-3 rows only, even layer split), at most
``OSDP_CANDIDATES`` configurations, and their points join the frontier like any other.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.plan import OpGroup, group_code
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

KEEP_CHOICES: tuple[tuple[OpGroup, ...], ...] = (
    (), (OpGroup.ATTENTION,), (OpGroup.EMBEDDING, OpGroup.HEAD),
    (OpGroup.ATTENTION, OpGroup.EMBEDDING, OpGroup.HEAD))
"""Groups kept gathered, tried on each candidate. Not the MLP: it holds two thirds of a dense
layer's weights, and keeping it is what ZeRO-2 already does to the whole layer (in the space)."""

SPLIT_CHOICES: tuple[tuple[int, int], ...] = ((1, 1), (4, 1), (1, 8), (4, 8))
"""(MLP slices, LM-head chunks) tried: 4 slices bring a dense MLP's gathered weights below the
attention's in Llama-style layers (F = 3.5 D, three matrices); 8 chunks bring the logits of a
128K vocabulary below one layer's activations. Illegal ones (widths or tokens not divisible,
MoE experts) are dropped."""

OSDP_CANDIDATES = 128
"""Zero-3 configurations whose variants are scored (fastest first): a work bound, not a dominance
rule, that keeps the pass to a few percent of the search's time."""


def osdp_rows(zero: np.ndarray, candidate: np.ndarray, time_s: np.ndarray, memory_bytes: np.ndarray,
              budget_bytes: float, fastest_fitting_s: float, limit: int = OSDP_CANDIDATES) -> np.ndarray:
    """Rows near the frontier (``candidate``) or held back by memory: the ``limit`` fastest
    zero-3 ones (every choice applies), and of all, the ``limit / 2`` fastest and the
    ``limit / 2`` leanest (the two ends of the frontier a chunked LM head moves)."""
    held = (memory_bytes > budget_bytes) & (time_s < fastest_fitting_s)
    rows = np.flatnonzero(candidate | held)
    z3 = rows[zero[rows] == 3]
    half = max(limit // 2, 1)
    return np.union1d(_smallest(z3, time_s, limit),
                      np.union1d(_smallest(rows, time_s, half), _smallest(rows, memory_bytes, half)))


def _smallest(rows: np.ndarray, key: np.ndarray, limit: int) -> np.ndarray:
    """The ``limit`` rows of smallest ``key`` (all when fewer)."""
    if rows.size <= limit:
        return rows
    return rows[np.argpartition(key[rows], limit - 1)[:limit]]


def legal_osdp(model: ModelSpec, training: TrainingSpec, v: PlanArrays) -> np.ndarray:
    """``Plan``'s OSDP rules, vectorised: groups kept and MLP slices under zero 3 only, MLP
    slices dividing a dense MLP's width per tp rank, LM-head chunks the tokens of a micro-batch."""
    width_ok = (model.ffn_hidden_size % (v.tp * v.mlp_splits) == 0) & (not model.is_moe)
    mlp_ok = (v.mlp_splits == 1) | (width_ok & (v.zero == 3))
    keep_ok = (v.keep == 0) | (v.zero == 3)
    tokens = v.micro_batch * training.seq_len // v.cp
    return mlp_ok & keep_ok & (tokens % v.head_splits == 0)


def osdp_variants(model: ModelSpec, training: TrainingSpec, space: PlanArrays,
                  rows: np.ndarray) -> tuple[PlanArrays, np.ndarray]:
    """Every legal (keep, splits) choice of each row but the row itself, and the row each came from."""
    choices = [(group_code(keep), k, c) for keep in KEEP_CHOICES for k, c in SPLIT_CHOICES
               if (keep, k, c) != ((), 1, 1)]
    codes = np.array(choices, dtype=np.int64)
    src = np.repeat(rows, len(choices))
    base = space.take(src)
    variants = replace(base, keep=np.tile(codes[:, 0], rows.size), mlp_splits=np.tile(codes[:, 1], rows.size),
                       head_splits=np.tile(codes[:, 2], rows.size))
    ok = np.flatnonzero(legal_osdp(model, training, variants))
    return variants.take(ok), src[ok]


__all__ = ["KEEP_CHOICES", "SPLIT_CHOICES", "OSDP_CANDIDATES", "osdp_rows", "legal_osdp", "osdp_variants"]
