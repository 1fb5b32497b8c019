"""The search entry point: the Pareto frontier of plans over (step time, peak memory per GPU).

Order of work (each step vectorised over all candidates, no Python call per plan):

1. :func:`~meshplan.search.space.enumerate_space` lists every legal global configuration (on
   large spaces, :mod:`meshplan.search.group_prune` first drops the cells a scored plan beats).
2. ``estimate_batch`` scores them all with an even layer split and the recompute policy on every
   layer; their frontier is a first, exact set of achievable points.
3. Configurations that could still reach the frontier with an uneven split are refined: their
   affine per-rank tables (:mod:`meshplan.search.tables`) feed the exact stage-split frontier
   (:mod:`meshplan.search.stages`), whose points are re-scored exactly by the cost model
   (:mod:`meshplan.search.refine`); the variant passes (offload, vocabulary parallel, OSDP, expert
   placement: :mod:`meshplan.search.variant_passes`) score variants of known configurations.
4. The union of all exact points is reduced to its Pareto frontier (:mod:`meshplan.search.frontier`).

The frontier covers every memory level; the recommended plan is the fastest that fits the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.flops import model_flops_per_token
from meshplan.errors import MeshplanError
from meshplan.plan import Plan, check_model_takes
from meshplan.search.frontier import Front, merge_fronts
from meshplan.search.embedding_chunks import embedding_loss_front, embedding_loss_plan
from meshplan.search.even import (EVEN_CHUNK_ROWS, PRUNE_MIN_CONFIGS, EvenCost,  # noqa: F401 (re-exported)
                                  even_estimate as _even_estimate, even_slice as _even_slice)
from meshplan.search.offload import searches_offload
from meshplan.search.group_prune import GROUP_PRUNE_MIN_CONFIGS, prune_groups
from meshplan.search.refine import PRUNE_MARGIN, _refine  # noqa: F401 (PRUNE_MARGIN re-exported)
from meshplan.search.space import (SearchOptions, configurations_per_group, cross_groups, enumerate_groups,
                                   take_groups)
from meshplan.search.split_scoring import chunk_split
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.search.variant_passes import (EMBED_KEY_BASE, EXPERT_KEY_BASE, OFFLOAD_KEY_BASE,  # noqa: F401
                                            OSDP_KEY_BASE, VOCAB_KEY_BASE, _offload_pass, _osdp_pass,
                                            _placement_pass, _vocab_pass)
from meshplan.spec.cluster import GIB, ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

REFINE_SLACK = 0.10
"""A configuration is refined with uneven splits when its even-split point, improved by this
fraction in both time and memory, would not be dominated by the even-split frontier; in time,
the point is also taken at the balanced-rank bound (``even.balanced_slice``: no layer split of
the configuration is faster) where that is faster, so no split on the frontier is skipped for
being faster than the even one, by however much, unless it is also more than this fraction
leaner. What the slack alone still bounds: memory (the first rank's in-flight activations) and
recomputing fewer layers than the policy's all; a work bound, not a dominance rule: on
Llama-3-70B x 1024 GPUs 0.10 and 0.15 give the same recommended plan and frontiers of 156 and 155
points at 1.0 s and 1.3 s of CPU. Tests set it to infinity (refine all) to check exactness."""


SEARCH_MAX_LAYERS = 1024
"""Deepest main stack the search takes. Its work grows with the layer count more than linearly
(the stage walk's grids hold every layer count per rank, and interleaving offers up to L / pp
virtual stages, each scored by a per-chunk loop): Llama-3-8B on 64 H100 searches in ~3 s at
32 to 2048 layers and 70 s at 4096 (session 8, solid3). 1024 is 8x the deepest published stack
(Megatron-LM's 1T model, 128 layers, Narayanan et al. 2021 Table 1); ``estimate`` takes any depth."""

STAGE_POINTS_PER_CONFIG: int | None = None
"""Most points the stage walk keeps per configuration that no known plan beats (None: no cap).
Until session 12 this was 12 steps, beaten steps included, so frontiers were truncated (70B on
1024 H100s lost 37 leaner points); the walk now jumps over the points a known plan beats
(stage_walk._jump) and walks every configuration's staircase to its end, so the frontier is exact
with respect to the walk (docs/search.md, "Session 13: walk13"; tests/planner/test_search_exact_walk.py)."""


@dataclass(frozen=True)
class ScoredPlan:
    """One frontier point: a plan and its cost under the cost model. ``peak_memory_bytes`` is the
    device peak "fits" reads (cost.device_memory.fit_bytes: the held peak, the CUDA context and
    NCCL's buffers), not the reserved peak ``estimate`` reports beside it."""

    plan: Plan
    num_gpus: int
    step_time_s: float
    peak_memory_bytes: float
    tokens_per_s_per_gpu: float
    mfu: float

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / GIB

    @property
    def fit_memory_gib(self) -> float:
        """What ``Estimate.fit_memory_gib`` reports for the plan: the frontier's memory figure."""
        return self.peak_memory_gib

    def gpu_hours_per_billion_tokens(self, training: TrainingSpec) -> float:
        return self.num_gpus * self.step_time_s / 3600.0 / (training.tokens_per_step / 1e9)


@dataclass(frozen=True)
class SearchResult:
    """The frontier for one GPU count (fastest first) and how the search went."""

    num_gpus: int
    frontier: tuple[ScoredPlan, ...]
    budget_bytes: float
    """The device peak a plan may reach to fit (:func:`fit_budget_bytes`): what
    ``peak_memory_bytes`` is compared with."""
    global_configs: int
    """Configurations of the space; under ``SearchOptions.allow``, counted before that mask
    (cells dropped unscored are never crossed, so their allowed share is not known)."""
    refined_configs: int
    plans_evaluated: int
    elapsed_s: float
    pruned_configs: int = 0
    """Global configurations scored by a lower bound only (one mean pipeline rank, or their cell's:
    :mod:`meshplan.search.group_prune`), not in full (:mod:`meshplan.search.prune`); counted in
    ``plans_evaluated``. Under ``SearchOptions.allow`` with cells dropped, the rows it refuses in
    the crossed cells count here too."""

    @property
    def fitting(self) -> tuple[ScoredPlan, ...]:
        return tuple(p for p in self.frontier if p.peak_memory_bytes <= self.budget_bytes)

    @property
    def recommended_index(self) -> int | None:
        """Index in ``frontier`` of the fastest plan that fits the budget."""
        for i, p in enumerate(self.frontier):
            if p.peak_memory_bytes <= self.budget_bytes:
                return i
        return None

    @property
    def recommended(self) -> ScoredPlan | None:
        i = self.recommended_index
        return None if i is None else self.frontier[i]

    @property
    def min_memory_bytes(self) -> float:
        return min((p.peak_memory_bytes for p in self.frontier), default=float("inf"))


def fit_budget_bytes(cluster: ClusterSpec, memory_bytes: float | None = None) -> float:
    """The device peak a plan may reach to fit ``memory_bytes`` of GPU memory (default: all of
    the GPU's): the memory itself, compared with the figure ``estimate``'s ``fits`` reads
    (cost/device_memory.py: ``fit_bytes``, the held peak and what lies outside the allocator)."""
    return cluster.gpu.memory_bytes if memory_bytes is None else float(memory_bytes)


def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
           calib: Calibration | None = None, budget_bytes: float | None = None,
           options: SearchOptions = SearchOptions(), refine_slack: float = REFINE_SLACK,
           memory_cap_bytes: float | None = None, stage_points: int | None = STAGE_POINTS_PER_CONFIG,
           progress: Callable[[str, float], None] | None = None, prune: bool | None = None) -> SearchResult:
    """Pareto frontier of plans for ``cluster.num_gpus`` GPUs (see the module docstring).
    ``prune`` False scores every configuration in full and walks every stage grid whole
    (:mod:`meshplan.search.prune` drops dominated configurations unscored, ``stage_frontier``
    cuts its grids short; the frontier is the same: tests compare the two); None prunes spaces
    of more than PRUNE_MIN_CONFIGS configurations. ``budget_bytes``: GPU memory per GPU a plan
    may use (default: the GPU's, :func:`fit_budget_bytes`). Every memory figure of the search, the
    frontier's ``peak_memory_bytes`` included, is the device peak ``fits`` reads
    (cost.device_memory.fit_bytes), so a plan is kept as fitting exactly when ``estimate`` calls
    it fitting, under either allocator setting."""
    start = time.perf_counter()
    calib = calib or calibration_for(cluster.gpu)
    ctx = CostContext(model, cluster, training, calib)
    budget = fit_budget_bytes(cluster, budget_bytes)
    # Uneven splits are searched up to this memory (plans above the GPU memory cannot run; the
    # even-split points above it stay on the frontier for the plot).
    cap = max(budget, cluster.gpu.memory_bytes) if memory_cap_bytes is None else float(memory_cap_bytes)
    tick = progress or (lambda what, frac: None)
    num_gpus = cluster.num_gpus

    check_model_takes(model, training)
    if model.num_layers > SEARCH_MAX_LAYERS:
        raise MeshplanError(f"{model.name} has {model.num_layers} layers: the search takes at most "
                            f"{SEARCH_MAX_LAYERS} (estimate a plan of a deeper model with `meshplan estimate`)")
    shrink = 1.0 / (1.0 + refine_slack) if np.isfinite(refine_slack) else 0.0
    groups = enumerate_groups(model, training, num_gpus, options)
    all_groups = groups  # the embedding / loss pass reads them unpruned (its rows lie outside the cell bounds)
    per_group = configurations_per_group(groups, model, training, options)
    prune_even = int(per_group.sum()) > PRUNE_MIN_CONFIGS if prune is None else prune
    seeded, cells = 0, None
    if prune_even and shrink > 0 and int(per_group.sum()) > GROUP_PRUNE_MIN_CONFIGS:
        # Cells (group, micro-batch size, recompute choice) a known plan beats are never crossed
        # (meshplan.search.group_prune). Under a caller's `allow` too: the seeds are crossed with
        # it (cross_groups), so only plans it allows prune, and a cell's bound is below each of
        # its configurations, allowed or not. (Skipping this step under `allow` made DeepSeek-V3
        # on 256 GB200 for --target megatron cross and score every cell: 8.5 -> 26.9 s, session 10.)
        cells, seeded = prune_groups(ctx, groups, options, shrink=shrink, budget_bytes=budget)
        groups = take_groups(groups, cells.groups)  # the groups holding a kept cell
    space = cross_groups(groups, model, training, options, keep=cells)
    dropped = int(per_group.sum()) - len(space) if cells is not None else 0
    # configurations_per_group counts before `allow`: with it, the space counted before the mask
    # (the allowed share of a dropped cell is never crossed), the same with or without cells dropped
    listed = int(per_group.sum()) if options.allow is not None else len(space) + dropped
    if len(space) == 0:
        raise MeshplanError(
            f"no legal plan for {model.name} on {num_gpus} GPUs with global batch "
            f"{training.global_batch} and seq_len {training.seq_len} (degrees must divide heads, "
            "layers, sequence and batch)")
    tick("even splits", 0.05)
    plans = space
    layer = shared_layer_cost(ctx, plans)
    even, pruned = _even_estimate(ctx, plans, layer, prune_shrink=shrink if prune_even and shrink > 0 else None,
                                  budget_bytes=budget)
    pruned += dropped
    evaluated = len(space) + dropped + seeded
    keys = np.flatnonzero(even.exact) if even.exact is not None else np.arange(len(space))
    even_front = Front.of(even.step_time_s[keys], even.peak_memory_bytes[keys], keys)  # bounds lie off it
    candidate = even.candidates(even_front, shrink)  # the refinement test, read by the stage and vocabulary passes
    tick("stage splits", 0.4)

    fronts = [Front(even_front.time_s, even_front.memory_bytes, -1 - even_front.key)]
    splits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (n, r, config) of keys 0, 1, ...
    refined = 0
    if options.nonuniform_stages:
        refined, scored_splits = _refine(ctx, space, plans, layer, even, candidate, fronts, splits,
                                         options=options, cap=cap,
                                         stage_points=stage_points, tick=tick,
                                         truncate=False if prune is False else None)
        evaluated += scored_splits

    vocab_space = None
    if options.vocab_parallel:
        vocab_space, vocab_front, scored_vocab = _vocab_pass(ctx, space, layer, candidate, options)
        fronts.append(vocab_front)
        evaluated += scored_vocab
    osdp_space = None
    if options.osdp:
        osdp_space, osdp_front, scored_osdp = _osdp_pass(ctx, space, layer, even, even.near(even_front, shrink),
                                                         merge_fronts(*fronts), budget, options)
        fronts.append(osdp_front)
        evaluated += scored_osdp
    expert_space = None
    if options.expert_placement and training.expert_load is not None and model.is_moe:
        expert_space, expert_front, scored_expert = _placement_pass(ctx, space, options)
        fronts.append(expert_front)
        evaluated += scored_expert
    off_space = None
    if searches_offload(cluster, options):
        off_space, off_front, scored_off = _offload_pass(ctx, space, layer, even, merge_fronts(*fronts),
                                                         budget, options)
        fronts.append(off_front)
        evaluated += scored_off
    embed_space, embed_front, scored_embed = embedding_loss_front(ctx, all_groups, options, EMBED_KEY_BASE,
                                                                  known=merge_fronts(*fronts))
    fronts.append(embed_front)
    evaluated += scored_embed
    front = merge_fronts(*fronts)
    split_start = np.cumsum([0] + [len(c) for _, _, c in splits])  # first key of each item
    scored = []
    tokens_flops = model_flops_per_token(model, training.seq_len)
    peak = cluster.gpu.peak_flops(training.precision)
    for t, m, k in zip(front.time_s, front.memory_bytes, front.key):
        k = int(k)
        if k >= EMBED_KEY_BASE:
            plan = embedding_loss_plan(ctx, embed_space, k - EMBED_KEY_BASE)
        elif k >= OSDP_KEY_BASE:
            plan = osdp_space.plan(k - OSDP_KEY_BASE)
        elif k >= EXPERT_KEY_BASE:
            plan = expert_space.plan(k - EXPERT_KEY_BASE)
        elif k >= VOCAB_KEY_BASE:
            plan = vocab_space.plan(k - VOCAB_KEY_BASE)
        elif k >= OFFLOAD_KEY_BASE:
            plan = off_space.plan(k - OFFLOAD_KEY_BASE)
        elif k < 0:
            plan = space.plan(-1 - k)
        else:
            i = int(np.searchsorted(split_start, k, side="right")) - 1
            j = k - int(split_start[i])
            n, r, cfg = splits[i][0][j], splits[i][1][j], int(splits[i][2][j])
            plan = space.plan(cfg, *chunk_split(n, r, int(space.vpp[cfg])))
        # the one place a frontier plan is completed: the even split where none was searched, and
        # recomputing zero layers written as no recompute (Plan.with_defaults's canonical form)
        plan = plan.with_defaults(model)
        tok = training.tokens_per_step / t / num_gpus
        scored.append(ScoredPlan(plan=plan, num_gpus=num_gpus, step_time_s=float(t),
                                 peak_memory_bytes=float(m), tokens_per_s_per_gpu=float(tok),
                                 mfu=float(tok * tokens_flops / peak)))
    tick("done", 1.0)
    if memory_cap_bytes is None and np.isfinite(cap) and not np.any(front.memory_bytes <= budget):
        # Nothing fits: walk the uneven splits down to the leanest plan, so that the "nothing
        # fits" message reports the least memory any plan needs, not only the even splits'.
        return search(model, cluster, training, calib=calib, budget_bytes=budget_bytes, options=options,
                      refine_slack=refine_slack, memory_cap_bytes=np.inf, stage_points=stage_points,
                      progress=progress, prune=prune)
    return SearchResult(num_gpus=num_gpus, frontier=tuple(scored), budget_bytes=budget,
                        global_configs=listed, refined_configs=refined,
                        plans_evaluated=evaluated, elapsed_s=time.perf_counter() - start,
                        pruned_configs=pruned)


def scaling_frontier(results: list[SearchResult]) -> list[SearchResult]:
    """Of several GPU counts, those whose recommended plan is faster than every smaller count's
    (the Pareto frontier over (GPUs, step time))."""
    best = float("inf")
    out = []
    for r in sorted(results, key=lambda r: r.num_gpus):
        rec = r.recommended
        if rec is not None and rec.step_time_s < best:
            out.append(r)
            best = rec.step_time_s
    return out
