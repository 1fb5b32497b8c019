"""The busiest expert-parallel rank under a skewed routing: placement, replicas, capacity.

Symbols: E experts, ep ranks, E/ep home slots per rank plus R replica slots (``Plan.expert_replicas``),
p_e the share of routed token copies expert e gets in one step and layer (spec/expert_load.py),
c the capacity factor (None: dropless).

* Capacity (Fedus et al. 2022, Switch Transformer Sec. 2.2; Megatron --moe-expert-capacity-factor):
  an expert keeps at most c/E of the copies, the rest are dropped: kept_e = min(p_e, c/E),
  dropped = 1 - sum_e kept_e. Dropless: kept_e = p_e.
* Rank load: rank r computes sum over the copies it holds of kept_e / copies_e (a replicated
  expert's tokens split evenly over its copies, FlexMoE, Nie et al. 2023 Sec. 3). The step waits
  for the busiest rank in every layer, so the load factor is the mean over steps and layers of
  max_r load_r / (1/ep): 1 for an even spread, at most c with capacity (then the drop caps the time).
* Placement, fixed for the run and per layer from the layer's mean kept shares over the log:
  contiguous (rank r holds ids [r*E/ep, (r+1)*E/ep), Megatron-Core and the runtime); balanced
  (longest-processing-time greedy, Graham 1969: the hottest expert first onto the least loaded
  rank with a free slot; kept only where it beats contiguous, so it is never worse); replicas
  (FlexMoE's greedy expansion: R*ep times, the busiest rank's hottest expert gets one more copy on
  the least loaded rank with a free replica slot that does not hold it, while that lowers the max).

A replica costs memory (its weights, gradients and optimizer states, like a home expert) and an
all-reduce of its gradient among the copies per step (FlexMoE Sec. 4.2): charged here as an
all-reduce of the R replica slots' gradients over the ep group, an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.spec.expert_load import ExpertLoad


@dataclass(frozen=True)
class Placement:
    """Copies of each expert per rank: ``copies[r, e]`` in {0, 1}."""

    copies: np.ndarray

    def rank_loads(self, kept: np.ndarray) -> np.ndarray:
        """(..., ep) load of each rank for kept shares (..., E)."""
        per_copy = kept / self.copies.sum(axis=0)  # each copy of e gets kept_e / copies_e
        return per_copy @ self.copies.T


def contiguous(num_experts: int, ep: int) -> Placement:
    """Rank r holds experts [r*E/ep, (r+1)*E/ep)."""
    _check_divides(num_experts, ep)
    rank = np.arange(num_experts) // (num_experts // ep)
    return Placement(copies=(rank[None, :] == np.arange(ep)[:, None]).astype(float))


def greedy(shares: np.ndarray, ep: int) -> Placement:
    """Longest-processing-time greedy with E/ep slots per rank (module docstring)."""
    E = shares.size
    _check_divides(E, ep)
    slots = E // ep
    load, held = np.zeros(ep), np.zeros(ep, dtype=int)
    copies = np.zeros((ep, E))
    for e in np.argsort(-shares, kind="stable"):
        open_ranks = np.flatnonzero(held < slots)
        r = open_ranks[np.argmin(load[open_ranks])]
        copies[r, e], load[r], held[r] = 1.0, load[r] + shares[e], held[r] + 1
    return Placement(copies=copies)


def balanced(shares: np.ndarray, ep: int) -> Placement:
    """The greedy placement, or the contiguous one where the greedy's busiest rank is busier."""
    g, c = greedy(shares, ep), contiguous(shares.size, ep)
    return g if g.rank_loads(shares).max() <= c.rank_loads(shares).max() else c


def with_replicas(base: Placement, shares: np.ndarray, replicas: int) -> Placement:
    """FlexMoE's greedy expansion of ``base`` by ``replicas`` slots per rank (module docstring)."""
    copies = base.copies.copy()
    ep, E = copies.shape
    free = np.full(ep, replicas)
    for _ in range(replicas * ep):
        loads = Placement(copies).rank_loads(shares)
        hot = int(np.argmax(loads))
        per_copy = np.where(copies[hot] > 0, shares / copies.sum(axis=0), -1.0)
        e = int(np.argmax(per_copy))
        room = np.flatnonzero((free > 0) & (copies[:, e] == 0))
        if room.size == 0:
            break
        r = room[np.argmin(loads[room])]
        trial = copies.copy()
        trial[r, e] = 1.0
        if Placement(trial).rank_loads(shares).max() >= loads.max():
            break  # one more copy no longer lowers the busiest rank
        copies, free[r] = trial, free[r] - 1
    return Placement(copies=copies)


def kept_shares(shares: np.ndarray, capacity_factor: float | None) -> np.ndarray:
    """Shares each expert keeps under the capacity factor (all of them when dropless)."""
    if capacity_factor is None:
        return shares
    return np.minimum(shares, capacity_factor / shares.shape[-1])


@dataclass(frozen=True)
class LoadStats:
    """What one expert load does to one (ep, placement, replicas) choice."""

    load_factor: float
    """Busiest rank's routed copies over the mean (1/ep of them), mean over steps and layers."""
    dropped_fraction: float
    """Share of routed copies dropped by the capacity factor (0 when dropless)."""
    imbalance: float
    """Busiest expert over the mean expert (max/mean), mean over steps and layers."""


def load_stats(load: ExpertLoad, num_experts: int, ep: int, *, balanced_placement: bool, replicas: int,
               capacity_factor: float | None) -> LoadStats:
    """Load factor, drop and imbalance of ``load`` under a placement (module docstring)."""
    shares = load.shares(num_experts)  # (steps, layers, E)
    if replicas > num_experts // ep and ep > 1:
        raise MeshplanError(f"expert_replicas={replicas} exceeds the {num_experts // ep} experts each of "
                            f"the ep={ep} ranks holds")
    kept = kept_shares(shares, capacity_factor)
    factors = np.empty(shares.shape[:2])
    for layer in range(shares.shape[1]):
        mean_shares = kept[:, layer].mean(axis=0)  # placed by the tokens the experts keep
        place = balanced(mean_shares, ep) if balanced_placement else contiguous(num_experts, ep)
        if replicas:
            place = with_replicas(place, mean_shares, replicas)
        factors[:, layer] = place.rank_loads(kept[:, layer]).max(axis=-1) * ep
    dropped = np.maximum(1.0 - kept.sum(axis=-1), 0.0)
    return LoadStats(load_factor=float(factors.mean()), dropped_fraction=float(dropped.mean()),
                     imbalance=float((shares.max(axis=-1) * num_experts).mean()))


def plan_load_factors(load: ExpertLoad, num_experts: int, ep: np.ndarray, balanced_placement: np.ndarray,
                      replicas: np.ndarray, capacity_factor: float | None) -> np.ndarray:
    """``load_stats(...).load_factor`` per plan row, computed once per distinct choice."""
    rows = np.stack([np.asarray(ep), np.asarray(balanced_placement, dtype=int), np.asarray(replicas)], axis=-1)
    choices, inverse = np.unique(rows.reshape(-1, 3), axis=0, return_inverse=True)
    factors = np.array([load_stats(load, num_experts, int(e), balanced_placement=bool(b), replicas=int(r),
                                   capacity_factor=capacity_factor).load_factor for e, b, r in choices])
    return factors[inverse.reshape(-1)].reshape(np.shape(ep))


def replica_factor(num_experts: int, ep: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    """Expert weights a rank holds over its home experts': 1 + R / (E/ep)."""
    return 1.0 + np.asarray(replicas, dtype=float) * np.asarray(ep, dtype=float) / num_experts


def _check_divides(num_experts: int, ep: int) -> None:
    if ep < 1 or num_experts % ep:
        raise MeshplanError(f"ep={ep} does not divide the {num_experts} experts")
