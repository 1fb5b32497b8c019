"""The variant passes of the search (step 3b of :mod:`meshplan.search.planner`): offload, vocabulary
parallel, OSDP and expert placement variants of known configurations, each scored under its
even split and keyed into the frontier from its own base."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.layer import LayerCost
from meshplan.cost.offload import host_budget_bytes
from meshplan.plan import OFFLOAD_ACTIVATIONS_BIT
from meshplan.search.even import EvenCost, even_estimate as _even_estimate
from meshplan.search.expert_load import placement_rows, placement_variants
from meshplan.search.frontier import Front
from meshplan.search.offload import (fastest, fewest_fitting_counts, held_back_rows, maximal_per_row, most_layer_count,
                                    most_offloaded, offload_variants, with_layer_count)
from meshplan.search.osdp import osdp_rows, osdp_variants
from meshplan.search.space import SearchOptions
from meshplan.search.tables import CostContext, SharedLayerCost, shared_layer_cost
from meshplan.search.vocab import vocab_rows, vocab_variants


OFFLOAD_KEY_BASE = 1 << 40
"""Frontier keys at or above this index the offload variants (below: uneven splits; negative:
even splits of the space's rows)."""


def _offload_pass(ctx: CostContext, space: PlanArrays, layer: SharedLayerCost, even: EvenCost,
                  known: Front, budget: float, options: SearchOptions) -> tuple[PlanArrays, Front, int]:
    """Offload variants of the configurations memory holds back (:mod:`meshplan.search.offload`),
    even split. First the most offloaded variant of every such configuration (its memory floor:
    each choice only removes GPU memory); then every choice of the fastest configurations whose
    floor fits, and where the target counts offloaded layers, the fewest count that fits of
    each variant that fits. Variants whose offloaded tensors overflow the host's memory are dropped."""
    fitting = known.time_s[known.memory_bytes <= budget]
    rows = held_back_rows(even.step_time_s, even.peak_memory_bytes, budget,
                          float(fitting.min()) if fitting.size else np.inf)
    host_cap = host_budget_bytes(ctx.cluster)
    count = most_layer_count(ctx.model.num_layers, options.offload_layer_counts)
    if options.allow is None:
        most, src = offload_variants(space, rows, most_offloaded(options.offloads), count)
    else:  # the target may refuse a row's widest choice (Megatron: the optimizer under FSDP): its widest allowed
        every, esrc = _allowed(*offload_variants(space, rows, options.offloads, count), options)
        top = maximal_per_row(esrc, every.offload)
        most, src = every.take(top), esrc[top]
    floor, _ = _even_estimate(ctx, most, _SharedRows(layer, src))
    # a counted activation offload's host memory falls with its count: the fewest count that fits
    # the GPU (below) is checked against the host, not the floor
    counted = (count > 0) & ((most.offload & OFFLOAD_ACTIVATIONS_BIT) > 0)
    lean = (floor.peak_memory_bytes <= budget) & ((floor.host_memory_bytes <= host_cap) | counted)
    firsts = fastest(src[lean], floor.step_time_s[lean])
    variants, vsrc = offload_variants(space, firsts, options.offloads, count)
    variants, vsrc = _allowed(variants, vsrc, options)
    est, _ = _even_estimate(ctx, variants, _SharedRows(layer, vsrc))
    parts = [(most, floor), (variants, est)]
    if count:
        parts.append(_fewest_counts(ctx, layer, variants, vsrc, est, budget, count))
    kept = [(v.take(ok), e.step_time_s[ok], e.peak_memory_bytes[ok])
            for v, e in parts for ok in [np.flatnonzero(e.host_memory_bytes <= host_cap)]]
    both = PlanArrays(**{f.name: np.concatenate([getattr(v, f.name) for v, _, _ in kept]) for f in fields(PlanArrays)})
    t = np.concatenate([k[1] for k in kept])
    m = np.concatenate([k[2] for k in kept])
    return both, Front.of(t, m, OFFLOAD_KEY_BASE + np.arange(t.size)), sum(len(v) for v, _ in parts)


def _fewest_counts(ctx: CostContext, layer: SharedLayerCost, variants: PlanArrays, vsrc: np.ndarray, est,
                   budget: float, most: int):
    """The variants offloading activations that fit the budget with ``most`` layers offloaded,
    at the fewest count that fits (``offload.fewest_fitting_counts``), and their estimate."""
    sel = np.flatnonzero(((variants.offload & OFFLOAD_ACTIVATIONS_BIT) > 0) & (est.peak_memory_bytes <= budget))
    sub, ssrc = variants.take(sel), vsrc[sel]

    def peak_of(idx, counts):
        e, _ = _even_estimate(ctx, with_layer_count(sub.take(idx), counts), _SharedRows(layer, ssrc[idx]))
        return e.peak_memory_bytes

    fewest = with_layer_count(sub, fewest_fitting_counts(sub, most, budget, peak_of))
    out, _ = _even_estimate(ctx, fewest, _SharedRows(layer, ssrc))
    return fewest, out


VOCAB_KEY_BASE = 1 << 41
"""Frontier keys at or above this index the vocabulary-parallel variants."""


def _vocab_pass(ctx: CostContext, space: PlanArrays, layer: SharedLayerCost, candidate: np.ndarray,
                options: SearchOptions) -> tuple[PlanArrays, Front, int]:
    """Vocabulary-parallel variants of the refinement candidates (:mod:`meshplan.search.vocab`)."""
    rows = vocab_rows(candidate, space.pp)
    variants, src = _allowed(vocab_variants(space, rows), rows, options)
    return _even_variants(ctx, variants, _SharedRows(layer, src), VOCAB_KEY_BASE)


OSDP_KEY_BASE = 1 << 43
"""Frontier keys at or above this index the OSDP variants."""

EMBED_KEY_BASE = 1 << 44
"""Frontier keys at or above this index the embedding / loss layouts (:mod:`meshplan.search.embedding_chunks`)."""


def _osdp_pass(ctx: CostContext, space: PlanArrays, layer: SharedLayerCost, even: EvenCost, candidate: np.ndarray,
               known: Front, budget: float, options: SearchOptions) -> tuple[PlanArrays, Front, int]:
    """OSDP variants of the configurations near the frontier or held back by memory
    (:mod:`meshplan.search.osdp`), even split."""
    fitting = known.time_s[known.memory_bytes <= budget]
    rows = osdp_rows(space.zero, candidate, even.step_time_s, even.peak_memory_bytes, budget,
                     float(fitting.min()) if fitting.size else np.inf)
    variants, src = _allowed(*osdp_variants(ctx.model, ctx.training, space, rows), options)
    return _even_variants(ctx, variants, _SharedRows(layer, src), OSDP_KEY_BASE)


def _even_variants(ctx: CostContext, variants: PlanArrays, layer: _SharedRows,
                   key_base: int) -> tuple[PlanArrays, Front, int]:
    """Variants of known configurations under their even split: the variants, their front keyed
    from ``key_base`` on, and how many were scored."""
    if len(variants) == 0:
        return variants, Front.empty(), 0
    est, _ = _even_estimate(ctx, variants, layer)
    keys = key_base + np.arange(len(variants))
    return variants, Front.of(est.step_time_s, est.peak_memory_bytes, keys), len(variants)


EXPERT_KEY_BASE = 1 << 42
"""Frontier keys at or above this index the expert-placement variants."""


def _placement_pass(ctx: CostContext, space: PlanArrays, options: SearchOptions) -> tuple[PlanArrays, Front, int]:
    """Balanced-placement and replica variants of every configuration with ep > 1
    (:mod:`meshplan.search.expert_load`); their layer costs are their own (the load changes them)."""
    rows = placement_rows(np.ones(len(space), dtype=bool), space.ep)
    variants, src = placement_variants(space, rows, ctx.model.moe_num_experts)
    variants, src = _allowed(variants, src, options)
    if len(variants) == 0:
        return variants, Front.empty(), 0
    est, _ = _even_estimate(ctx, variants, shared_layer_cost(ctx, variants))
    return variants, Front.of(est.step_time_s, est.peak_memory_bytes,
                              EXPERT_KEY_BASE + np.arange(len(variants))), len(variants)


def _allowed(variants: PlanArrays, src: np.ndarray, options: SearchOptions) -> tuple[PlanArrays, np.ndarray]:
    if options.allow is None or len(variants) == 0:
        return variants, src
    keep = np.flatnonzero(options.allow(variants))
    return variants.take(keep), src[keep]


@dataclass(frozen=True)
class _SharedRows:
    """The shared layer costs of the space's rows ``src``, indexed like the variants."""

    layer: SharedLayerCost
    src: np.ndarray

    def take(self, idx) -> LayerCost:
        return self.layer.take(self.src[idx])

    def take_stack(self, idx):
        return self.layer.take_stack(self.src[idx])
