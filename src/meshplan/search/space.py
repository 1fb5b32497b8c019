"""The legal global choices of a plan, enumerated as arrays (one row per global configuration).

A *global configuration* fixes everything except the per-stage layer split and the per-stage
number of recomputed layers (those are searched by :mod:`meshplan.search.stages`): the mesh
degrees ``pp x dp_replicate x dp_shard x cp x tp`` (product = GPU count), expert parallel ``ep``
and expert tensor parallel ``etp``,
ZeRO stage, sequence parallel, context-parallel method, pipeline schedule and virtual stages,
micro-batch size and recompute policy.

Every pruning rule used here is listed in docs/search.md with the reason it loses no optimum:
either the choice is illegal (a degree that does not divide heads, layers, sequence or batch) or
it duplicates another row exactly (e.g. a schedule with ``pp == 1``, a ZeRO stage over one rank).

Modules: :mod:`~meshplan.search.options` (what may vary, the column codes),
:mod:`~meshplan.search.space_rules` (the legality rules), this one (enumeration and crossing),
:mod:`~meshplan.search.space_membership` (is a given plan in the space, and why not).
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from typing import Callable

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.rank_layers import needs_rank_mix
from meshplan.cost.recompute_modules import SUBSUMED
from meshplan.errors import MeshplanError
from meshplan.plan import Recompute, RecomputeModule, Schedule, missing_module, recompute_module_code
from meshplan.search.options import (CP_METHODS, MAX_VPP, OFFLOAD_CHOICES, RECOMPUTES, SCHEDULES,  # noqa: F401
                                     SearchOptions)  # (re-exported: the space's options and codes)
from meshplan.search.space_rules import (MICRO_BATCH_READS, _rule_cp_method, _rule_degrees, _rule_ep,  # noqa: F401
                                         _rule_max_cp, _rule_micro_batch, _rule_schedule, _rule_sp, _rule_zero,
                                         _schedule_pairs)
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@lru_cache(maxsize=256)  # pure in (n, parts); the recursion meets each (n // d, parts - 1) many times
def factorisations(n: int, parts: int) -> np.ndarray:
    """Every ordered tuple of ``parts`` positive integers whose product is ``n``: shape (k, parts),
    read-only (shared by every caller)."""
    if parts == 1:
        out = np.array([[n]], dtype=np.int64)
    else:
        rows = []
        for d in divisors(n):
            rest = factorisations(n // d, parts - 1)
            rows.append(np.column_stack([np.full(len(rest), d, dtype=np.int64), rest]))
        out = np.concatenate(rows)
    out.flags.writeable = False
    return out


def _cross(cols: dict[str, np.ndarray], name: str, values: np.ndarray) -> dict[str, np.ndarray]:
    """Every row of ``cols`` combined with every value (a new column ``name``)."""
    n = next(iter(cols.values())).size
    out = {k: np.repeat(v, values.size) for k, v in cols.items()}
    out[name] = np.tile(values, n)
    return out


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


def _cross_legal(cols: dict[str, np.ndarray], name: str, values: np.ndarray,
                 rule: Callable[[dict[str, np.ndarray]], np.ndarray], reads: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``_keep(_cross(cols, name, values), rule(...))`` without materialising the full cross:
    the rule is applied to one row per distinct combination of the columns it ``reads`` (plus
    ``name``), and each row is repeated once per value legal for it (same rows, same order)."""
    n = next(iter(cols.values())).size
    key = np.zeros(n, dtype=np.int64)
    for k in reads:  # mixed-radix code of the columns the rule reads
        col = cols[k].astype(np.int64)
        key = key * (int(col.max(initial=0)) + 1) + col
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    reps = _cross(_keep(cols, first), name, values)
    legal = rule(reps).reshape(first.size, values.size)
    per_rep = legal.sum(axis=1)
    flat = np.broadcast_to(values, legal.shape)[legal]  # legal values, rep by rep
    counts = per_rep[inverse.reshape(-1)]
    out = {k: np.repeat(v, counts) for k, v in cols.items()}
    starts = np.concatenate(([0], np.cumsum(per_rep)[:-1]))[inverse.reshape(-1)]
    pos = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    out[name] = flat[np.repeat(starts, counts) + pos]
    return out


GROUP_COLUMNS = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "zero", "sp", "cp_method", "ep", "etp")
"""The columns of a *group* of global configurations: every configuration is one group crossed
with a schedule and its virtual stages, a micro-batch size and a recompute policy (and module
set); :mod:`meshplan.search.group_prune` bounds a group over all of those at once."""


def enumerate_space(model: ModelSpec, training: TrainingSpec, num_gpus: int,
                    options: SearchOptions = SearchOptions()) -> PlanArrays:
    """Every legal global configuration for ``num_gpus`` GPUs (rules: docs/search.md)."""
    return cross_groups(enumerate_groups(model, training, num_gpus, options), model, training, options)


def enumerate_groups(model: ModelSpec, training: TrainingSpec, num_gpus: int,
                     options: SearchOptions = SearchOptions()) -> dict[str, np.ndarray]:
    """The legal groups (GROUP_COLUMNS) for ``num_gpus`` GPUs, in the order ``enumerate_space``
    lists their configurations."""
    if num_gpus < 1:
        raise MeshplanError(f"GPU count must be positive, got {num_gpus}")
    f = factorisations(num_gpus, 5)
    c = {"pp": f[:, 0], "dp_replicate": f[:, 1], "dp_shard": f[:, 2], "cp": f[:, 3], "tp": f[:, 4]}
    c = _keep(c, _rule_degrees(c, model, training) & _rule_max_cp(c, options))
    c = _cross(c, "zero", np.arange(4))
    c = _keep(c, _rule_zero(c))
    c = _cross(c, "sp", np.array([False, True]))
    c = _keep(c, _rule_sp(c, training))
    c = _cross(c, "cp_method", np.array([CP_METHODS.index(m) for m in options.cp_methods]))
    c = _keep(c, _rule_cp_method(c, model, options))
    c = _cross(c, "ep", np.array(divisors(model.moe_num_experts) if model.is_moe else [1]))
    if model.is_moe:
        c = _cross(c, "etp", np.array(divisors(int(c["tp"].max())) if c["tp"].size else [1]))
    else:
        c["etp"] = c["tp"].copy()
    return _keep(c, _rule_ep(c, model))


def take_groups(groups: dict[str, np.ndarray], index) -> dict[str, np.ndarray]:
    """The groups at ``index`` (an index array or a mask), in their order."""
    return _keep(groups, index)


def recompute_variants(model: ModelSpec, options: SearchOptions) -> tuple[np.ndarray, np.ndarray]:
    """(recompute code, module-set code) of each recompute choice a configuration is crossed
    with, in the order ``enumerate_space`` lists them (every policy with module set 0, then
    selective with each further module set)."""
    recomputes = np.array([RECOMPUTES.index(r) for r in options.recomputes])
    codes = module_codes(model, options)
    n_sel = int(np.count_nonzero(recomputes == RECOMPUTES.index(Recompute.SELECTIVE)))
    return (np.concatenate([recomputes, np.full(n_sel * codes.size, RECOMPUTES.index(Recompute.SELECTIVE))]),
            np.concatenate([np.zeros(recomputes.size, dtype=np.int64), np.tile(codes, n_sel)]))


def micro_batch_sizes(training: TrainingSpec) -> np.ndarray:
    """Every micro-batch size the space may hold (those dividing the global batch), ascending."""
    return np.array(divisors(training.global_batch), dtype=np.int64)


def cross_groups(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
                 options: SearchOptions = SearchOptions(), keep: np.ndarray | None = None) -> PlanArrays:
    """Every legal global configuration of ``groups`` (rows of ``enumerate_groups``): crossing
    keeps each group's rows in its place, so the configurations of a subset of the groups are
    ``enumerate_space``'s rows of those groups, in the same order. ``keep`` (groups x
    ``micro_batch_sizes`` x ``recompute_variants``, bool) lists only the configurations it marks
    (same order); or a ``group_prune.CellKeep`` (its ``mask`` of the rows of each group, schedule
    pair and size: the configurations of ``cells`` less those of pairs its bounds drop)."""
    if options.allow is not None:
        counts = configurations_per_group(groups, model, training, options)
        if int(counts.sum()) > CROSS_BLOCK_ROWS:
            return _cross_allowed_in_blocks(groups, model, training, options, keep, counts)
    return _cross_whole(groups, model, training, options, keep)


def _cross_whole(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
                 options: SearchOptions, keep: np.ndarray | None) -> PlanArrays:
    """:func:`cross_groups` in one piece."""
    return _arrays(_crossed(groups, model, training, options, keep), options)


def _arrays(c: dict[str, np.ndarray], options: SearchOptions) -> PlanArrays:
    """The PlanArrays of crossed columns ``c``, the variant columns constant, ``options.allow`` applied."""
    # Columns that only the variant passes vary are one value on every row: read-only
    # broadcasts (stride 0), not millions of copies (PlanArrays.take keeps them so).
    n = c["tp"].size
    const = {"offload": 0, "offload_layers": 0,  # offload variants: meshplan.search.offload
             "vocab_parallel": False,  # variants: meshplan.search.vocab
             "keep": 0, "mlp_splits": 1, "head_splits": 1,  # variants: meshplan.search.osdp
             "expert_balanced": False, "expert_replicas": 0}  # variants: meshplan.search.expert_load
    for name, value in const.items():
        c[name] = np.broadcast_to(np.array(value, dtype=bool if isinstance(value, bool) else np.int64), (n,))
    space = PlanArrays(**{f.name: c[f.name] if f.name in const else np.ascontiguousarray(c[f.name])
                          for f in fields(PlanArrays)})
    if options.allow is not None:
        space = space.take(np.flatnonzero(options.allow(space)))
    return space


CROSS_BLOCK_ROWS = 1 << 20
"""With an ``allow`` mask, a space of more rows than this is crossed and filtered in blocks of
groups of about this many rows (:func:`_cross_allowed_in_blocks`), not materialised whole
before the mask drops most of it (Qwen3-30B-A3B on 256 GB200 for the meshplan target: 12.5M
rows of ~20 columns, 1.4M kept)."""


def _cross_allowed_in_blocks(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
                             options: SearchOptions, keep: np.ndarray | None, counts: np.ndarray) -> PlanArrays:
    """:func:`cross_groups` with ``options.allow``, block by block of consecutive groups: the same
    rows in the same order. ``allow`` is a row-wise mask (the search applies it to any subset of
    rows: variants, frontiers); the crossing puts every group's rows with module set 0 first,
    in group order, then every group's rows of the other module sets (:func:`_cross_recompute`;
    ``module_codes`` holds no 0), so the blocks' first parts come first, then their second parts."""
    edges = np.searchsorted(np.cumsum(counts), np.arange(CROSS_BLOCK_ROWS, int(counts.sum()), CROSS_BLOCK_ROWS))
    heads, tails = [], []
    for block in np.split(np.arange(counts.size), np.unique(edges[(edges > 0) & (edges < counts.size)])):
        part = _cross_whole(take_groups(groups, block), model, training, options,
                            None if keep is None else keep[block] if isinstance(keep, np.ndarray) else keep.take(block))
        tail = np.asarray(part.recompute_modules) != 0
        heads.append(part.take(np.flatnonzero(~tail)))
        tails.append(part.take(np.flatnonzero(tail)))
    parts = heads + tails
    return PlanArrays(**{f.name: _join([getattr(x, f.name) for x in parts]) for f in fields(PlanArrays)})


def _join(columns: list[np.ndarray]) -> np.ndarray:
    """One column of the blocks: a column :func:`_cross_whole` writes as one value on every row
    (a broadcast, stride 0, the same value in every block) stays one."""
    full = [c for c in columns if c.size]
    if full and all(c.strides == (0,) for c in full) and len({c[0].item() for c in full}) == 1:
        return np.broadcast_to(full[0][:1].reshape(()), (sum(c.shape[0] for c in columns),))
    return np.concatenate(columns)


def embedding_loss_vpp(model: ModelSpec, pp, options: SearchOptions) -> np.ndarray:
    """Virtual stages per rank of the embedding / loss layout on ``pp`` ranks (``num_layers + 2``
    chunks, ``SearchOptions.embedding_loss_chunks``), 0 where there is none: pp >= 2 dividing
    L + 2 into at least two chunks per rank, within ``options.max_vpp``, more chunks than layers
    (with at most L chunks the stage search already offers the split: ``Plan.embedding_loss_split``
    is one uneven split among the others); not for a model whose ranks are charged their own
    leading dense layers or MTP modules (``cost.rank_layers.needs_rank_mix``)."""
    L, p = model.num_layers, np.asarray(pp, dtype=np.int64)
    v = (L + 2) // np.maximum(p, 1)
    top = options.max_vpp if options.max_vpp is not None else (L + 2) // 2
    ok = ((p >= 2) & ((L + 2) % np.maximum(p, 1) == 0) & (v >= 2) & (v <= top) & (p * v > L)
          & options.embedding_loss_chunks & (Schedule.INTERLEAVED_1F1B in options.schedules)
          & (not needs_rank_mix(model)))  # (search.embedding_chunks: not scored for those)
    return np.where(ok, v, 0)


def embedding_loss_space(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
                         options: SearchOptions) -> PlanArrays | None:
    """The configurations of ``groups`` under the embedding / loss layout (interleaved 1F1B over
    ``num_layers + 2`` chunks, :func:`embedding_loss_vpp`), crossed with the micro-batch sizes and
    recompute choices as ``cross_groups`` crosses the others (same rules); None when there is none.
    Their one layer split is scored by :mod:`meshplan.search.embedding_chunks`."""
    vpp = embedding_loss_vpp(model, groups["pp"], options)
    c = _keep(groups, vpp > 0)
    if c["pp"].size == 0:
        return None
    c["schedule"] = np.full(c["pp"].size, SCHEDULES.index(Schedule.INTERLEAVED_1F1B))
    c["vpp"] = vpp[vpp > 0]
    c = _cross_legal(c, "micro_batch", np.array(divisors(training.global_batch)),
                     lambda c: _rule_micro_batch(c, training), MICRO_BATCH_READS)
    if c["pp"].size == 0:
        return None
    c = _cross_recompute(c, np.array([RECOMPUTES.index(r) for r in options.recomputes]),
                         module_codes(model, options))
    space = _arrays(c, options)
    return space if len(space) else None


def configurations_per_group(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
                             options: SearchOptions = SearchOptions()) -> np.ndarray:
    """How many configurations ``cross_groups`` lists for each group before ``options.allow``
    (the count depends on the pipeline and data-parallel degrees alone: the schedule and
    micro-batch rules read no other group column)."""
    key = np.zeros(groups["pp"].size, dtype=np.int64)
    for k in ("pp", "dp_replicate", "dp_shard"):
        col = groups[k].astype(np.int64)
        key = key * (int(col.max(initial=0)) + 1) + col
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    reps = _keep(groups, first)
    reps["_rep"] = np.arange(first.size)
    counts = np.bincount(_crossed(reps, model, training, options)["_rep"], minlength=first.size)
    return counts[inverse.reshape(-1)]


def _crossed(groups: dict[str, np.ndarray], model: ModelSpec, training: TrainingSpec,
             options: SearchOptions, keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The columns of ``cross_groups`` (any extra column of ``groups`` carried along)."""
    c = dict(groups)
    if keep is not None:
        c["_group"] = np.arange(c["pp"].size)
    sched, vpp = _schedule_pairs(options, model)
    c = _cross(c, "_pair", np.arange(sched.size))
    c["schedule"], c["vpp"] = sched[c["_pair"]], vpp[c["_pair"]]
    if keep is None or isinstance(keep, np.ndarray):
        del c["_pair"]
    c = _keep(c, _rule_schedule(c, model, options))
    c = _cross_legal(c, "micro_batch", np.array(divisors(training.global_batch)),
                     lambda c: _rule_micro_batch(c, training), MICRO_BATCH_READS)
    mask = None
    if keep is not None:
        group, size = c.pop("_group"), np.searchsorted(micro_batch_sizes(training), c["micro_batch"])
        mask = keep[group, size] if isinstance(keep, np.ndarray) else keep.mask(group, c.pop("_pair"), size)
    return _cross_recompute(c, np.array([RECOMPUTES.index(r) for r in options.recomputes]),
                            module_codes(model, options), mask)


def _cross_recompute(cols: dict[str, np.ndarray], recomputes: np.ndarray, codes: np.ndarray,
                     mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every row with every recompute policy (module set 0), then the selective rows again once
    per module set in ``codes``: ``_cross`` by ``recomputes``, then the selective rows of that
    crossed with ``codes`` appended, written into one array per column (rows in that order;
    tens of millions of rows are not copied three times). ``mask`` (rows x variants, in
    ``recompute_variants``' order) keeps only the variants it marks."""
    n = next(iter(cols.values())).size
    r = recomputes.size
    per_row = int(np.count_nonzero(recomputes == RECOMPUTES.index(Recompute.SELECTIVE))) * codes.size
    if mask is not None:
        head, tail = mask[:, :r], mask[:, r:]
        rows = np.concatenate([np.repeat(np.arange(n), head.sum(axis=1)), np.repeat(np.arange(n), tail.sum(axis=1))])
        out = {k: v[rows] for k, v in cols.items()}
        sel = RECOMPUTES.index(Recompute.SELECTIVE)
        out["recompute"] = np.concatenate([np.broadcast_to(recomputes, head.shape)[head],
                                           np.full(int(tail.sum()), sel, dtype=recomputes.dtype)])
        out["recompute_modules"] = np.concatenate([np.zeros(int(head.sum()), dtype=np.int64),
                                                   np.broadcast_to(np.tile(codes, per_row // max(codes.size, 1)),
                                                                   tail.shape)[tail]])
        return out
    out = {}
    for k, v in cols.items():
        col = np.empty(n * (r + per_row), dtype=v.dtype)
        col[:n * r].reshape(n, r)[:] = v[:, None]
        col[n * r:].reshape(n, per_row)[:] = v[:, None]  # the selective rows' copies, row by row
        out[k] = col
    out["recompute"] = np.concatenate([np.tile(recomputes, n),
                                       np.full(n * per_row, RECOMPUTES.index(Recompute.SELECTIVE))])
    out["recompute_modules"] = np.concatenate([np.zeros(n * r, dtype=np.int64),
                                               np.tile(codes, n * per_row // max(codes.size, 1))])
    return out


def cost_module_code(modules: tuple[RecomputeModule, ...]) -> int:
    """``recompute_module_code`` of ``modules`` less the modules another chosen one contains
    (``cost.recompute_modules.SUBSUMED``: ``moe`` holds ``moe_act`` and ``shared_experts``): sets
    with one such code cost the same (the cost model counts the outer module only), so the space
    holds one of them."""
    chosen = {RecomputeModule(m) for m in modules}
    return recompute_module_code(tuple(m for m in chosen if SUBSUMED.get(m) not in chosen))


def module_codes(model: ModelSpec, options: SearchOptions) -> np.ndarray:
    """Codes (``cost_module_code``) of the non-default module sets searched for ``model``."""
    if not model.is_moe or Recompute.SELECTIVE not in options.recomputes:
        return np.zeros(0, dtype=np.int64)
    codes = {cost_module_code(s) for s in options.recompute_module_sets if missing_module(model, s) is None}
    return np.array(sorted(codes - {0}), dtype=np.int64)
