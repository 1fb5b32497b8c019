"""The search entry point: the Pareto frontier of plans over (step time, peak memory per GPU).

Order of work (each step vectorised over all candidates, no Python call per plan):

1. :func:`~meshplan.search.space.enumerate_space` lists every legal global configuration (on
   large spaces, :mod:`meshplan.search.group_prune` first drops the cells a scored plan beats).
2. ``estimate_batch`` scores them all with an even layer split and the recompute policy on every
   layer; their frontier is a first, exact set of achievable points.
3. Configurations that could still reach the frontier with an uneven split are refined: their
   affine per-rank tables (:mod:`meshplan.search.tables`) feed the exact stage-split frontier
   (:mod:`meshplan.search.stages`), whose points are re-scored exactly by the cost model.
4. The union of all exact points is reduced to its Pareto frontier (:mod:`meshplan.search.frontier`).

The frontier covers every memory level; the recommended plan is the fastest that fits the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.layer import LayerCost
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.flops import model_flops_per_token
from meshplan.errors import MeshplanError
from meshplan.plan import Plan, Recompute, check_model_takes
from meshplan.cost.offload import host_budget_bytes
from meshplan.search.frontier import Front, dominated_by, merge_fronts
from meshplan.search.embedding_chunks import embedding_loss_front, embedding_loss_plan
from meshplan.search.expert_load import placement_rows, placement_variants
from meshplan.search.vocab import vocab_rows, vocab_variants
from meshplan.search.even import (EVEN_CHUNK_ROWS, PRUNE_MIN_CONFIGS, EvenCost,  # noqa: F401 (re-exported)
                                  even_estimate as _even_estimate, even_slice as _even_slice)
from meshplan.search.osdp import osdp_rows, osdp_variants
from meshplan.search.offload import fastest, held_back_rows, most_offloaded, offload_variants, searches_offload
from meshplan.search.group_prune import GROUP_PRUNE_MIN_CONFIGS, prune_groups
from meshplan.search.space import (RECOMPUTES, SearchOptions, configurations_per_group, cross_groups,
                                   enumerate_groups, take_groups)
from meshplan.search.stages import StagePoints, relaxed_bounds, stage_frontier
from meshplan.search.tables import (MEMORY_PROBE_LAYERS, CostContext, SharedLayerCost, chunk_split, pipeline_alpha,
                                    score_splits, shared_layer_cost, stage_probes, stage_table)
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

PRUNE_MARGIN = 0.05
"""Bounds from the affine per-rank tables are lowered by this fraction before they are compared
with known plans. The tables are exact for the cost model's linear terms, but the overlap of
data-parallel and ZeRO-3 communication with compute (``comms.exposed``: a min of two lines) is
read off at one or two layers and extrapolated, which can overstate a rank's time by a few
percent; the margin keeps such configurations in the search."""

SEARCH_MAX_LAYERS = 1024
"""Deepest main stack the search takes. Its work grows with the layer count more than linearly
(the stage walk's grids hold every layer count per rank, and interleaving offers up to L / pp
virtual stages, each scored by a per-chunk loop): Llama-3-8B on 64 H100 searches in ~3 s at
32 to 2048 layers and 70 s at 4096 (session 8, solid3). 1024 is 8x the deepest published stack
(Megatron-LM's 1T model, 128 layers, Narayanan et al. 2021 Table 1); ``estimate`` takes any depth."""

STAGE_POINTS_PER_CONFIG = 12
"""Most frontier points walked per configuration by the stage search (fastest first). A global
frontier point rarely comes from deep in one configuration's staircase (the next configuration
with more recompute or sharding takes over); tests walk every point to check exactness."""


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
    refined_configs: int
    plans_evaluated: int
    elapsed_s: float
    pruned_configs: int = 0
    """Global configurations scored by a lower bound only (one mean pipeline rank), not in
    full (:mod:`meshplan.search.prune`); counted in ``plans_evaluated``."""

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
           memory_cap_bytes: float | None = None, stage_points: int = STAGE_POINTS_PER_CONFIG,
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
    if prune_even and shrink > 0 and options.allow is None and int(per_group.sum()) > GROUP_PRUNE_MIN_CONFIGS:
        # Cells (group, micro-batch size, recompute choice) a known plan beats are never crossed
        # (meshplan.search.group_prune); a caller's `allow` reads the crossed rows: not then.
        cells, seeded = prune_groups(ctx, groups, options, shrink=shrink, budget_bytes=budget)
        live = cells.any(axis=(1, 2))
        groups, cells = take_groups(groups, live), cells[live]
    space = cross_groups(groups, model, training, options, keep=cells)
    dropped = int(per_group.sum()) - len(space) if cells is not None else 0
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
    embed_space, embed_front, scored_embed = embedding_loss_front(ctx, all_groups, options, EMBED_KEY_BASE)
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
                        global_configs=len(space) + dropped, refined_configs=refined,
                        plans_evaluated=evaluated, elapsed_s=time.perf_counter() - start,
                        pruned_configs=pruned)


OFFLOAD_KEY_BASE = 1 << 40
"""Frontier keys at or above this index the offload variants (below: uneven splits; negative:
even splits of the space's rows)."""


def _offload_pass(ctx: CostContext, space: PlanArrays, layer: SharedLayerCost, even: EvenCost,
                  known: Front, budget: float, options: SearchOptions) -> tuple[PlanArrays, Front, int]:
    """Offload variants of the configurations memory holds back (:mod:`meshplan.search.offload`),
    even split. First the most offloaded variant of every such configuration (its memory floor:
    each choice only removes GPU memory); then every choice of the fastest configurations whose
    floor fits. Variants whose offloaded tensors overflow the host's memory are dropped."""
    fitting = known.time_s[known.memory_bytes <= budget]
    rows = held_back_rows(even.step_time_s, even.peak_memory_bytes, budget,
                          float(fitting.min()) if fitting.size else np.inf)
    host_cap = host_budget_bytes(ctx.cluster)
    most, src = offload_variants(space, rows, most_offloaded(options.offloads))
    most, src = _allowed(most, src, options)
    floor, _ = _even_estimate(ctx, most, _SharedRows(layer, src))
    lean = (floor.peak_memory_bytes <= budget) & (floor.host_memory_bytes <= host_cap)
    firsts = fastest(src[lean], floor.step_time_s[lean])
    variants, vsrc = offload_variants(space, firsts, options.offloads)
    variants, vsrc = _allowed(variants, vsrc, options)
    est, _ = _even_estimate(ctx, variants, _SharedRows(layer, vsrc))
    ok_m = np.flatnonzero(floor.host_memory_bytes <= host_cap)
    ok_v = np.flatnonzero(est.host_memory_bytes <= host_cap)
    both = PlanArrays(**{f.name: np.concatenate([getattr(most, f.name)[ok_m], getattr(variants, f.name)[ok_v]])
                         for f in fields(PlanArrays)})
    t = np.concatenate([floor.step_time_s[ok_m], est.step_time_s[ok_v]])
    m = np.concatenate([floor.peak_memory_bytes[ok_m], est.peak_memory_bytes[ok_v]])
    return both, Front.of(t, m, OFFLOAD_KEY_BASE + np.arange(t.size)), len(most) + len(variants)


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


def _refine(ctx: CostContext, space: PlanArrays, plans: PlanArrays, layer: SharedLayerCost,
            even: EvenCost, candidate: np.ndarray, fronts: list[Front],
            splits: list[tuple[np.ndarray, np.ndarray, np.ndarray]], *, options: SearchOptions,
            cap: float, stage_points: int,
            tick: Callable[[str, float], None], truncate: bool | None = None) -> tuple[int, int]:
    """Uneven splits of the promising configurations (step 3 of the module docstring).

    Appends one Front per group of configurations to ``fronts`` (keys >= 0 number the rows of
    ``splits``, in order: each item holds the per-rank layer and recomputed counts and the
    configuration of its next rows) and returns (configurations refined, splits scored).
    """
    model = ctx.model
    refined = evaluated = 0
    # Policy 'none' is recompute policy 'selective' with zero recomputed layers: refine the
    # recomputing policies only (their frontier contains every no-recompute split).
    none_code = RECOMPUTES.index(Recompute.NONE)
    has_rec = np.isin(space.recompute, [RECOMPUTES.index(r) for r in options.recomputes
                                        if r != Recompute.NONE])
    if has_rec.any():
        candidate = candidate & (space.recompute != none_code)  # (a new array: the caller's is shared)
    # One group per pipeline degree and grid width class: configurations with different
    # virtual-stage counts share a table (StageTable.chunks per config) when their usable
    # layer-count ranges (L - p v + 1 values per rank) are within a factor of two, so that no
    # table is padded to much more than its configurations need. Most promising groups first so
    # that their plans prune the later groups; within a group fastest even split first.
    cand = np.flatnonzero(candidate)  # the rest of the space is not read below
    width = model.num_layers - space.pp[cand] * space.vpp[cand] + 1
    group_of = space.pp[cand].astype(np.int64) * 64 + np.floor(np.log2(np.maximum(width, 1))).astype(np.int64)
    groups, group_idx = np.unique(group_of, return_inverse=True)
    best = np.full(groups.size, np.inf)
    np.minimum.at(best, group_idx, even.step_time_s[cand])
    order = np.argsort(best, kind="stable")
    by_group = np.argsort(group_idx, kind="stable")  # candidates grouped, in row order within a group
    starts = np.searchsorted(group_idx[by_group], np.arange(groups.size + 1))
    # The stage tables' probes of every candidate in one cost-model call (cand is ascending).
    probes = stage_probes(ctx, plans.take(cand), shared=layer.rows(cand))
    next_key = 0
    for gi, g in enumerate(order):
        idx = cand[by_group[starts[g]:starts[g + 1]]]
        idx = idx[np.argsort(even.step_time_s[idx], kind="stable")]
        pp = int(space.pp[idx[0]])
        # pp = 1: the staircase is one point per recomputed-layer count, L + 1 at most, walked
        # whole (a cap would keep the points nearest the memory cap and drop the leaner ones).
        walk_points = stage_points if pp > 1 else max(stage_points, model.num_layers + 1)
        refined += idx.size
        pts_t, pts_m, pts_k = [], [], []
        for chunk in np.array_split(idx, max(1, int(np.ceil(idx.size * pp * model.num_layers / 1e6)))):
            sub = plans.take(chunk)
            tbl = stage_table(ctx, sub, int(pp), sub.vpp, probes=probes.take(np.searchsorted(cand, chunk)))
            alpha = pipeline_alpha(ctx, sub)
            known = merge_fronts(*fronts)

            def keep_going(rows, t_next, m_floor, alpha=alpha, known=known):
                # alpha * max(t + x/alpha) = max(alpha t + x) bounds the step from below.
                return ~dominated_by(known.time_s, known.memory_bytes,
                                     alpha[rows] * t_next * (1 - PRUNE_MARGIN),
                                     m_floor * (1 - PRUNE_MARGIN))

            t_lb, m_lb = relaxed_bounds(tbl)
            live = keep_going(np.arange(len(sub)), t_lb, m_lb) & (m_lb <= cap)
            if not live.any():
                continue
            chunk, sub, tbl = chunk[live], sub.take(live), tbl.take(np.flatnonzero(live))
            alpha = alpha[live]
            pts = stage_frontier(tbl, max_points=walk_points, memory_cap_bytes=cap,
                                 keep_going=lambda r, t, m, a=alpha: keep_going(r, t, m, alpha=a),
                                 truncate=truncate)
            if truncate is not False and pts.config.size:
                pts = _worth_scoring(pts, keep_going(pts.config, pts.max_time_s, pts.peak_bytes, alpha=alpha))
            if pts.config.size == 0:
                continue
            exact = score_splits(ctx, sub.take(pts.config), pts.layers, pts.recomputed,
                                 shared=layer.rows(chunk[pts.config]))  # chunk: the live rows by now
            evaluated += pts.config.size
            splits.append((pts.layers, pts.recomputed, chunk[pts.config]))  # keys next_key...
            pts_t.append(exact.step_time_s)
            pts_m.append(exact.peak_memory_bytes)
            pts_k.append(np.arange(next_key, next_key + pts.config.size))
            next_key += pts.config.size
        if pts_t:
            fronts.append(Front.of(np.concatenate(pts_t), np.concatenate(pts_m), np.concatenate(pts_k)))
        tick("stage splits", 0.4 + 0.55 * (gi + 1) / len(groups))

    return refined, evaluated


def _worth_scoring(pts: StagePoints, undominated: np.ndarray) -> StagePoints:
    """The walked points worth an exact score: those whose own table point, lowered by
    PRUNE_MARGIN (``undominated``: the walk's ``keep_going`` asked of the point itself), no
    known plan dominates, and every point with a rank of fewer than MEMORY_PROBE_LAYERS layers
    (there the table may overstate memory by a gathered ZeRO-3 layer: tables.MEMORY_PROBE_LAYERS).

    The walk's own stop (``keep_going`` of the next point's time and the configuration's least
    memory) rests on the tables being within PRUNE_MARGIN of the exact cost; this asks the same
    of each point's (time, memory): a point so dominated is off the frontier, and ~93 % of the
    walked points of Qwen3-30B-A3B on 256 GB200 are (session 10: 3.2M points, 6 s of exact
    scoring). ``search(prune=False)`` scores them all (tests compare the two)."""
    keep = undominated | (pts.layers.min(axis=1) < MEMORY_PROBE_LAYERS)
    if keep.all():
        return pts
    return StagePoints(pts.config[keep], pts.max_time_s[keep], pts.peak_bytes[keep], pts.layers[keep],
                       pts.recomputed[keep])
