"""What :func:`meshplan.cost.batch.rank_cost` computes from the plans alone, the same for every
pipeline rank of a plan: link of each parallel group, shards of each ZeRO stage, LM head and
embedding time, pipeline p2p. A caller scoring several ranks of the same plans computes it once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost import comms
from meshplan.cost.arrays import RC_FULL, RC_SELECTIVE, PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.layer import LayerCost, activation_bytes, gemm_time
from meshplan.cost.osdp import uses_osdp
from meshplan.cost.precision import compute_dtype_peak_flops, op_rates
from meshplan.cost.vocab import vocab_sync_s
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec


def num_microbatches(training: TrainingSpec, plans: PlanArrays) -> np.ndarray:
    return np.maximum(training.global_batch // np.maximum(plans.dp * plans.micro_batch, 1), 1)


@dataclass(frozen=True)
class PlanTerms:
    """What :func:`~meshplan.cost.batch.rank_cost` computes from the plans alone (not the rank, its
    layers or its embedding / head): the same for every rank of a plan, so a caller scoring several
    ranks of the same plans computes it once (:func:`plan_terms`) and passes it to each call.

    Symbols: ``t``, ``v`` and ``m`` are Narayanan et al. 2021's (Sec. 2 notation): the tensor-parallel
    degree, the model chunks (virtual stages) per pipeline rank and the micro-batches per step, as
    floats per plan (``m_float``; ``pp_float`` the pipeline degree p). Every other field is named
    with its unit."""

    hbm_bytes_per_s: float
    head_flops_per_s: float
    """Peak rate of the LM head's GEMM (the compute dtype's: it stays bf16)."""
    linear_flops_per_s: float
    """Peak rate of the layers' linear GEMMs (fp8/fp4 where the recipe runs them so)."""
    t: np.ndarray
    v: np.ndarray
    tokens_per_microbatch: np.ndarray
    """Tokens of one micro-batch on a rank: micro_batch * seq_len / cp."""
    recompute_s_per_layer: np.ndarray
    """Time to recompute one layer's forward under the plan's recompute policy (0 without)."""
    vocab_per_tp_rank: np.ndarray
    """LM-head columns per tp rank, padded as Megatron pads (Calibration.vocab_pad_multiple)."""
    head_compute_s: np.ndarray
    embed_compute_s: np.ndarray
    p2p_s: np.ndarray
    embed_params: float
    """Embedding parameters per tp rank."""
    head_params: np.ndarray
    """LM-head parameters per tp rank (with a copy of a tied embedding when pp > 1)."""
    zero_ranks: np.ndarray
    """Ranks ZeRO shards dense states over: dp_shard * cp (torchtitan)."""
    expert_zero_ranks: np.ndarray
    """The experts' data-parallel degree: dp_shard * cp * tp / (etp * ep), at least 1."""
    zero_link: comms.Link
    """The link of the zero_ranks group (ranks tp apart)."""
    expert_zero_link: comms.Link
    """The experts' data-parallel group (expert_zero_ranks ranks ep * etp apart: Megatron lays experts out
    etp, ep, edp from the innermost), which reduces the expert gradients."""
    replicate_link: comms.Link
    """The dp_replicate group's link (HSDP's outer all-reduce)."""
    act_policy: np.ndarray
    """Activation bytes one layer saves under the plan's recompute policy."""
    m: np.ndarray
    m_float: np.ndarray
    pp_float: np.ndarray
    dense_shards: tuple[np.ndarray, ...]
    """Indexed by ZeRO stage 0-3: ranks a dense state is sharded over at that stage (zero_ranks where
    the plan's ZeRO stage reaches it, else 1)."""
    expert_shards: tuple[np.ndarray, ...]
    """The same for expert states (the experts' data-parallel degree zero_ranks * tp / (etp * ep), at
    least 1; zero_ranks / ep when etp = tp)."""
    vocab_sync_s: np.ndarray | float = 0.0
    """Per micro-batch: vocabulary parallelism's synchronisation over the pp ranks (cost.vocab)."""
    osdp: bool = False
    """Whether any plan keeps a group gathered or splits an operator (cost.osdp.uses_osdp)."""



def layer_policy(plans: PlanArrays, layer: LayerCost) -> tuple[np.ndarray, np.ndarray]:
    """(recompute time, activations kept) of one layer under each plan's recompute policy."""
    rec_one = np.where(plans.recompute == RC_FULL, layer.recompute_full_s,
                       np.where(plans.recompute == RC_SELECTIVE, layer.recompute_selective_s, 0.0))
    act_policy = np.where(plans.recompute == RC_FULL, layer.act_full_bytes,
                          np.where(plans.recompute == RC_SELECTIVE, layer.act_selective_bytes,
                                   layer.act_none_bytes))
    return rec_one, act_policy


def plan_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
               calib: Calibration, layer: LayerCost) -> PlanTerms:
    """The rank-independent part of :func:`~meshplan.cost.batch.rank_cost` (see :class:`PlanTerms`)."""
    peak = compute_dtype_peak_flops(cluster, training)  # the LM head stays bf16 (cost/precision.py)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s * calib.hbm_efficiency
    t = plans.tp.astype(float)
    c = plans.cp.astype(float)
    p = plans.pp
    v = plans.vpp.astype(float)
    T = plans.micro_batch * training.seq_len / c
    D, V = float(model.hidden_size), float(model.vocab_size)
    ab = activation_bytes(training.precision)  # bytes per activation element
    rec_one, act_policy = layer_policy(plans, layer)
    # LM head: (T x D) @ (D x V/t) forward, 2x backward; cross-entropy reads/writes the logits.
    # Per-rank vocabulary padded as Megatron does (see Calibration.vocab_pad_multiple).
    pad = max(calib.vocab_pad_multiple, 1.0)
    Vt = np.ceil(V / (t * pad)) * pad
    head_fwd = gemm_time(calib, peak, T, Vt, D) + 3.0 * T * Vt * ab / hbm
    # Pipeline p2p: (b, S/c, D)/t activation out, its gradient back, per chunk (Narayanan 2021
    # Sec. 4.1 scatter/gather splits the message over the TP ranks).
    pp_link = comms.group_link(cluster, calib, p, plans.tp * plans.cp * plans.dp_shard * plans.dp_replicate)
    p2p = 2.0 * v * comms.p2p_time(T * D * ab / t, p > 1, pp_link)
    embed_p = model.embedding_params() / t
    tied_copy = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    head_p = (model.head_params() + np.where(p > 1, tied_copy, 0)) / t
    n1 = (plans.dp_shard * plans.cp).astype(float)  # ZeRO shards over dp_shard x cp (torchtitan)
    z = plans.zero
    dense_shards = (n1,) + tuple(np.where(z >= stage, n1, 1.0) for stage in (1, 2, 3))
    if model.is_moe:
        n1_e = np.maximum(n1 * plans.tp / (plans.etp * plans.ep), 1.0)  # edp = dp_shard*cp*tp/(etp*ep)
        expert_shards = (n1_e,) + tuple(np.where(z >= stage, n1_e, 1.0) for stage in (1, 2, 3))
    else:  # etp = tp, ep = 1: edp = n1, the same shards
        n1_e, expert_shards = n1, dense_shards
    lvl1 = comms.group_link(cluster, calib, n1, plans.tp)  # (dense models: also the experts' group)
    m = num_microbatches(training, plans)
    vocab_sync = vocab_sync_s(plans.vocab_parallel, p, T, D, ab, t, pp_link) if plans.vocab_parallel.any() else 0.0
    return PlanTerms(vocab_sync_s=vocab_sync, osdp=uses_osdp(plans),
        dense_shards=dense_shards, expert_shards=expert_shards,
        hbm_bytes_per_s=hbm, head_flops_per_s=peak, linear_flops_per_s=op_rates(cluster, training, calib).linear_flops,
        t=t, v=v, tokens_per_microbatch=T, recompute_s_per_layer=rec_one, vocab_per_tp_rank=Vt, head_compute_s=3.0 * head_fwd,
        embed_compute_s=3.0 * T * D * ab / hbm, p2p_s=p2p,  # embedding lookup + grad
        embed_params=embed_p, head_params=head_p, zero_ranks=n1, expert_zero_ranks=n1_e,
        zero_link=lvl1, expert_zero_link=comms.group_link(cluster, calib, n1_e, plans.ep * plans.etp) if model.is_moe else lvl1,
        replicate_link=comms.group_link(cluster, calib, plans.dp_replicate, plans.tp * plans.cp * plans.dp_shard),
        act_policy=act_policy, m=m, m_float=m.astype(float), pp_float=p.astype(float))
