"""The legality rules of the space, one function per column group, each a vectorised mask over
the columns (docs/search.md lists them with the reason each loses no optimum)."""

from __future__ import annotations

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, Schedule
from meshplan.search.options import CP_METHODS, MAX_VPP, SCHEDULES, SearchOptions
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


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
