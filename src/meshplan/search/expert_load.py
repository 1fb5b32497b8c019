"""Expert placement and hot-expert replicas as searched choices (:mod:`meshplan.cost.expert_load`).

They only matter when the training describes a skewed expert load, and only change how the
experts sit on the ep ranks: the busiest rank's tokens (balanced placement lowers them at no
cost; replicas lower them further for more expert memory and a gradient all-reduce per step).
A skewed load can slow a contiguous configuration far beyond the refinement slack while its
balanced variant is the fastest plan, so the variants are scored for every configuration with
expert parallelism (even layer split; their points join the frontier): the search costs up to
three times as many rows when, and only when, an expert load is given.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from meshplan.cost.arrays import PlanArrays

SEARCHED_REPLICAS = (0, 1)
"""Replica slots per rank tried with the balanced placement: one slot already holds ep copies of
hot experts (FlexMoE's gain comes from the first copies of the hottest, Nie et al. 2023 Sec. 6)."""


def placement_rows(candidate: np.ndarray, ep: np.ndarray) -> np.ndarray:
    """Rows to try other placements on: the candidates with expert parallelism."""
    return np.flatnonzero(candidate & (ep > 1))


def placement_variants(space: PlanArrays, rows: np.ndarray, num_experts: int) -> tuple[PlanArrays, np.ndarray]:
    """Each row balanced, with each of SEARCHED_REPLICAS that its ranks' experts allow; the
    variants and the space row each comes from."""
    parts, srcs = [], []
    for r in SEARCHED_REPLICAS:
        ok = rows[r <= num_experts // space.ep[rows]]
        base = space.take(ok)
        parts.append(replace(base, expert_balanced=np.ones(len(base), dtype=bool),
                             expert_replicas=np.full(len(base), r)))
        srcs.append(ok)
    src = np.concatenate(srcs)
    return PlanArrays(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(PlanArrays)}), src
