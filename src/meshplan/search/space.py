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
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Callable

import numpy as np

from meshplan.cost.arrays import CP_METHOD_CODES, RECOMPUTE_CODES, SCHEDULE_CODES, PlanArrays
from meshplan.cost.rank_layers import needs_rank_mix
from meshplan.cost.recompute_modules import SUBSUMED
from meshplan.errors import MeshplanError
from meshplan.plan import (CPMethod, Offload, Plan, Recompute, RecomputeModule, Schedule, missing_module,
                           recompute_module_code)
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

# The integer codes of the enum columns: the cost model's (one table, cost.arrays).
SCHEDULES: tuple[Schedule, ...] = SCHEDULE_CODES
RECOMPUTES: tuple[Recompute, ...] = RECOMPUTE_CODES
CP_METHODS: tuple[CPMethod, ...] = CP_METHOD_CODES

OFFLOAD_CHOICES: tuple[tuple[Offload, ...], ...] = (
    (Offload.OPTIMIZER,), (Offload.ACTIVATIONS,), (Offload.OPTIMIZER, Offload.ACTIVATIONS),
    (Offload.OPTIMIZER, Offload.PARAMS), (Offload.OPTIMIZER, Offload.PARAMS, Offload.ACTIVATIONS))
"""Every legal non-empty offload combination (``params`` goes with ``optimizer``: Plan's rule)."""

MAX_VPP = 8
"""Virtual stages per pipeline rank searched with any layer split. Beyond it (published
Megatron-Core recipes use 10 to 24 chunks per rank) only chunk counts that split the layers
evenly are searched, the layers alone or with the embedding and the loss counted as one layer
each: Megatron needs ``num_layers`` (or ``num_layers + 2`` with
``--account-for-embedding/loss-in-pipeline-split``) divisible by ``pp * vpp`` without a custom
layout (Qwen3-235B's 94 layers: pp 4 x vpp 12). This bounds the space (it is not a dominance
rule)."""


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


@dataclass(frozen=True)
class SearchOptions:
    """What the search may vary; defaults search everything the cost model can estimate."""

    schedules: tuple[Schedule, ...] = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)
    recomputes: tuple[Recompute, ...] = RECOMPUTES
    cp_methods: tuple[CPMethod, ...] = CP_METHODS
    max_vpp: int | None = None
    """Largest vpp searched; None: as many as the layer count allows (``MAX_VPP`` with any
    split, beyond it even splits only)."""
    nonuniform_stages: bool = True
    """Search per-stage layer counts and recomputed-layer counts (else even split, all layers)."""
    max_cp: int | None = None
    """Largest context-parallel degree (None: any); 1 for a target without context parallel."""
    offloads: tuple[tuple[Offload, ...], ...] = OFFLOAD_CHOICES
    """Offload choices tried on the configurations memory holds back (``meshplan.search.offload``);
    empty: no offload. Tried only on clusters that describe their host side."""
    vocab_parallel: bool = True
    """Try vocabulary parallelism over the pipeline ranks (``meshplan.search.vocab``)."""
    osdp: bool = True
    """Try OSDP's groups kept gathered and operator splits on zero-3 configurations
    (``meshplan.search.osdp``)."""
    expert_placement: bool = True
    """Try balanced expert placement and hot-expert replicas when the training describes its
    expert load (``meshplan.search.expert_load``)."""
    recompute_module_sets: tuple[tuple[RecomputeModule, ...], ...] = ()
    """Beyond the default (the attention core), the module sets selective recompute is also
    tried with on MoE models (Megatron-Core's ``--recompute-modules``); sets naming a module the
    model lacks are skipped. Empty: the default only."""
    embedding_loss_chunks: bool = False
    """Also search interleaved plans of ``num_layers + 2`` virtual stages, the embedding and the
    loss each a virtual stage of its own (Megatron-Core's
    ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``,
    ``TransformerConfig.account_for_*_in_pipeline_split``: the embedding and the loss count as one
    layer each and the ``num_layers + 2`` slots split evenly over ``pp * vpp``; the Llama 3.1 405B
    Megatron-Bridge recipe, pp16 x vpp8 for 126 layers, scripts/performance/configs/llama/
    llama31_workload_base_configs.py@0013c9a). Such a layout has one split (``plan.embedding_loss_split``):
    :mod:`meshplan.search.embedding_chunks` scores it exactly. On for the targets that run stages
    holding no transformer layer: Megatron, torchtitan (its default split gives them with L + 2
    stages: ``export.common.search_options_for``) and meshplan's runtime (its pipeline cuts such a
    stage as any other: tests/runtime/test_pipeline_embedding_chunks.py checks loss parity); off by
    default (``search()`` without a target) and for DeepSpeed (no interleaving)."""
    allow: "Callable[[PlanArrays], np.ndarray] | None" = None
    """A caller's vectorised restriction (True = keep), e.g. what an export target can run;
    not a pruning rule: the frontier is then the restricted space's frontier."""


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


# ---- the rules, one function per column group (docs/search.md lists them with reasons) -------
def _rule_degrees(c, model: ModelSpec, training: TrainingSpec) -> np.ndarray:
    """TP splits heads and FFN columns (KV heads split or replicate); every pipeline stage needs
    a layer; the batch splits evenly over data parallel; load-balanced CP cuts 2*cp chunks."""
    tp, cp, pp = c["tp"], c["cp"], c["pp"]
    dp = c["dp_replicate"] * c["dp_shard"]
    ok = (model.num_heads % tp == 0) & (model.ffn_hidden_size % tp == 0)
    ok &= (model.num_kv_heads % tp == 0) | (tp % model.num_kv_heads == 0)
    if "M" in model.hybrid_pattern:  # Mamba-2 TP splits heads and B/C groups (Megatron MambaMixer)
        ok &= (model.mamba_num_heads % tp == 0) & (model.mamba_groups % tp == 0)
        ok &= (model.mamba_num_heads // tp) % cp == 0  # Mamba CP exchanges heads (all-to-all)
    ok &= (pp <= model.num_layers) & (training.global_batch % dp == 0)
    ok &= (cp == 1) | (training.seq_len % (2 * cp) == 0)
    return ok


def _rule_max_cp(c, options: SearchOptions) -> np.ndarray:
    """A caller's restriction (e.g. an export target without context parallel), not a pruning rule."""
    return np.ones(c["cp"].shape, dtype=bool) if options.max_cp is None else c["cp"] <= options.max_cp


def _rule_zero(c) -> np.ndarray:
    """dp_shard > 1 needs ZeRO >= 1; ZeRO shards over dp_shard x cp, so with dp_shard = 1 and
    cp > 1 every stage is its own plan (ZeRO over the context-parallel ranks alone); over a
    single rank every stage equals plain DP (stage 0)."""
    return np.where(c["dp_shard"] > 1, c["zero"] >= 1, (c["cp"] > 1) | (c["zero"] == 0))


def _rule_sp(c, training: TrainingSpec) -> np.ndarray:
    return ~c["sp"] | ((c["tp"] > 1) & (training.seq_len % c["tp"] == 0))


def _rule_cp_method(c, model: ModelSpec, options: SearchOptions) -> np.ndarray:
    """The method matters only with cp > 1 (else one row); all-to-all needs heads/tp % cp == 0."""
    codes = [CP_METHODS.index(m) for m in options.cp_methods]
    ring = CP_METHODS.index(CPMethod.RING) if CPMethod.RING in options.cp_methods else codes[0]
    a2a = c["cp_method"] == CP_METHODS.index(CPMethod.ALL_TO_ALL)
    heads_per_tp = model.num_heads // c["tp"]
    return np.isin(c["cp_method"], codes) & np.where(
        c["cp"] == 1, c["cp_method"] == ring, ~a2a | (heads_per_tp % c["cp"] == 0))


def _rule_ep(c, model: ModelSpec) -> np.ndarray:
    """Experts fold onto the dp_shard x cp x tp ranks as edp x ep x etp (Megatron's MoE parallel
    folding): etp * ep divides them, etp divides tp and the expert FFN; dense models: etp = tp."""
    experts = model.moe_num_experts if model.is_moe else 1
    ok = ((c["dp_shard"] * c["cp"] * c["tp"]) % (c["etp"] * c["ep"]) == 0) & (experts % c["ep"] == 0)
    ok &= c["tp"] % c["etp"] == 0
    if model.is_moe:
        return ok & (model.moe_ffn_hidden_size % c["etp"] == 0)
    return ok & (c["etp"] == c["tp"])


def _max_vpp(model: ModelSpec, options: SearchOptions) -> int:
    return options.max_vpp if options.max_vpp is not None else max(model.num_layers // 2, 1)


def _schedule_pairs(options: SearchOptions, model: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    # beyond MAX_VPP only chunk counts that can split the layers evenly (see MAX_VPP)
    L = model.num_layers
    vpps = [v for v in range(2, _max_vpp(model, options) + 1) if v <= MAX_VPP or L % v == 0 or (L + 2) % v == 0]
    pairs = [(SCHEDULES.index(s), v) for s in options.schedules
             for v in (vpps if s.supports_virtual_stages else (1,))]
    if not pairs:
        raise MeshplanError("no pipeline schedule to search")
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _rule_schedule(c, model: ModelSpec, options: SearchOptions) -> np.ndarray:
    """With pp == 1 the schedule is irrelevant: one row (1F1B, else the first listed)."""
    sched, vpp = _schedule_pairs(options, model)
    listed = np.zeros(c["pp"].shape, dtype=bool)
    for s_code, v in zip(sched, vpp):
        listed |= (c["schedule"] == s_code) & (c["vpp"] == v)
    one_f1b = SCHEDULES.index(Schedule.ONE_F_ONE_B)
    base = one_f1b if Schedule.ONE_F_ONE_B in options.schedules else int(sched[0])
    first = (c["schedule"] == base) & (c["vpp"] == vpp[sched == base].min())
    chunks = c["pp"] * c["vpp"]
    bounded = (c["vpp"] <= MAX_VPP) | (model.num_layers % chunks == 0) | ((model.num_layers + 2) % chunks == 0)
    return listed & np.where(c["pp"] == 1, first, (chunks <= model.num_layers) & bounded)


MICRO_BATCH_READS = ("dp_replicate", "dp_shard", "pp", "schedule", "vpp")
"""The columns besides ``micro_batch`` that :func:`_rule_micro_batch` reads."""


def _rule_micro_batch(c, training: TrainingSpec) -> np.ndarray:
    """Micro-batches divide the per-replica batch; interleaving needs m % pp == 0 (Megatron)."""
    per_dp = training.global_batch // (c["dp_replicate"] * c["dp_shard"])
    ok = per_dp % c["micro_batch"] == 0
    nmicro = per_dp // c["micro_batch"]
    interleaved = (c["schedule"] == SCHEDULES.index(Schedule.INTERLEAVED_1F1B)) & (c["vpp"] > 1)
    return ok & (~interleaved | (nmicro % c["pp"] == 0))


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
    (same order)."""
    return _arrays(_crossed(groups, model, training, options, keep), options)


def _arrays(c: dict[str, np.ndarray], options: SearchOptions) -> PlanArrays:
    """The PlanArrays of crossed columns ``c``, the variant columns constant, ``options.allow`` applied."""
    # Columns that only the variant passes vary are one value on every row: read-only
    # broadcasts (stride 0), not millions of copies (PlanArrays.take keeps them so).
    n = c["tp"].size
    const = {"offload": 0,  # offload variants: meshplan.search.offload
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
    del c["_pair"]
    c = _keep(c, _rule_schedule(c, model, options))
    c = _cross_legal(c, "micro_batch", np.array(divisors(training.global_batch)),
                     lambda c: _rule_micro_batch(c, training), MICRO_BATCH_READS)
    mask = None
    if keep is not None:
        group = c.pop("_group")
        mask = keep[group, np.searchsorted(micro_batch_sizes(training), c["micro_batch"])]
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


def canonical(plan: Plan) -> Plan:
    """The plan the space holds for an equivalent one: ZeRO over a single shard is stage 0, a
    schedule with pp == 1 (or interleaved 1F1B with one chunk) is 1F1B, the CP method with
    cp == 1 is ring."""
    from dataclasses import replace

    d = plan.dims
    out = plan
    if d.dp_shard * d.cp == 1 and plan.zero:
        out = replace(out, zero=0)
    if (d.pp == 1 and out.schedule != Schedule.ONE_F_ONE_B) or (
            out.schedule == Schedule.INTERLEAVED_1F1B and out.vpp == 1):
        out = replace(out, schedule=Schedule.ONE_F_ONE_B, vpp=1)  # interleaving one chunk is 1F1B
    if d.cp == 1 and out.cp_method != CPMethod.RING:
        out = replace(out, cp_method=CPMethod.RING)
    return out


def in_space(model: ModelSpec, training: TrainingSpec, num_gpus: int, plan: Plan,
             options: SearchOptions = SearchOptions()) -> bool:
    """Whether the global configuration of ``plan`` is one ``enumerate_space`` lists (same rules,
    one row; the layer split is the stage search's business)."""
    g = PlanArrays.from_plans([plan])
    c = {f.name: getattr(g, f.name) for f in fields(PlanArrays)}
    d = plan.dims
    if d.world_size != num_gpus or plan.recompute not in options.recomputes:
        return False
    code = cost_module_code(plan.recompute_modules)
    if code and code not in module_codes(model, options):
        return False
    ok = (_rule_degrees(c, model, training) & _rule_max_cp(c, options) & _rule_zero(c) & _rule_sp(c, training)
          & _rule_cp_method(c, model, options) & _rule_ep(c, model)
          & _rule_schedule_or_embedding(c, model, plan, options) & _rule_micro_batch(c, training))
    return bool(ok[0]) and training.global_batch % plan.micro_batch == 0


def _rule_schedule_or_embedding(c, model: ModelSpec, plan: Plan, options: SearchOptions) -> np.ndarray:
    """``_rule_schedule``, or the embedding / loss layout (:func:`embedding_loss_vpp`) with its
    one split (``plan.embedding_loss_split``; an empty split is filled with it)."""
    from meshplan.plan import embedding_loss_split

    v = int(embedding_loss_vpp(model, c["pp"], options)[0])
    own = (plan.schedule == Schedule.INTERLEAVED_1F1B and v == plan.vpp and (
        not plan.stage_layers or tuple(plan.stage_layers) == embedding_loss_split(model.num_layers, plan.dims.pp * v)))
    return _rule_schedule(c, model, options) | own


def why_outside(model: ModelSpec, training: TrainingSpec, num_gpus: int, plan: Plan,
                options: SearchOptions = SearchOptions()) -> str | None:
    """The first rule of the space that ``plan`` (taken canonical) breaks, in words, or None when
    ``in_space`` holds it: what `bench/bench_experts.py` says of a published plan the search
    cannot propose."""
    plan = canonical(plan)
    g = PlanArrays.from_plans([plan])
    c = {f.name: getattr(g, f.name) for f in fields(PlanArrays)}
    if plan.dims.world_size != num_gpus:
        return f"the plan uses {plan.dims.world_size} GPUs, the job {num_gpus}"
    if plan.recompute not in options.recomputes:
        return f"recompute {plan.recompute.value} is not searched for this target"
    code = cost_module_code(plan.recompute_modules)
    if code and code not in module_codes(model, options):
        return (f"recompute modules {'+'.join(m.value for m in plan.recompute_modules)} are not searched "
                "for this target and model")
    if training.global_batch % plan.micro_batch:
        return f"micro-batch {plan.micro_batch} does not divide the global batch {training.global_batch}"
    rules = (
        (_rule_degrees(c, model, training), "tp must divide the heads, FFN and KV heads; pp <= layers; "
                                            "dp divides the batch; seq divisible by 2*cp"),
        (_rule_max_cp(c, options), "context parallel is not available on this target"),
        (_rule_zero(c), "ZeRO stage and sharding degree disagree"),
        (_rule_sp(c, training), "sequence parallel needs tp > 1 dividing the sequence"),
        (_rule_cp_method(c, model, options), "the CP method is not searched (or heads/tp not divisible by cp)"),
        (_rule_ep(c, model), "expert parallel must fold onto dp_shard x cp x tp and divide the experts"),
        (_rule_schedule_or_embedding(c, model, plan, options),
         f"schedule {plan.schedule.value} with pp={plan.dims.pp}, vpp={plan.vpp} is not searched (pp*vpp "
         f"chunks <= the {model.num_layers} layers, vpp <= {MAX_VPP} or chunks dividing the layers"
         + (f"; or {model.num_layers + 2} chunks with the embedding and the loss on chunks of their own, "
            "not for models with leading dense layers or MTP modules"
            if options.embedding_loss_chunks else "; more chunks than layers not for this target") + ")"),
        (_rule_micro_batch(c, training), "interleaving needs the micro-batch count to be a multiple of pp"),
    )
    return next((why for ok, why in rules if not bool(np.asarray(ok)[0])), None)
