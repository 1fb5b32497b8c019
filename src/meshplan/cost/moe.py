"""A MoE block as it runs (Megatron-Core's MoELayer): router, token permutation, dispatch over
the expert-parallel group, the experts' grouped GEMMs, combine and un-permutation.

Symbols as in cost/layer.py; per GPU: T tokens, t = tp, e_t = expert tp, ep, E experts, k top-k,
W the width tokens travel at (hidden, or the latent width of a LatentMoE).

* Router: a (T x D) @ (D x E) GEMM in the compute dtype (bf16 even under fp8: cost/precision.py),
  plus its fp32 softmax / top-k pass over the T x E logits (read + write, 4 B each).
* Biased experts' output bias and a clamped GLU's clamp run as eager ops outside the fused
  kernels (cost/expert_passes.py; forward here, their own backward in ``bwd_extra_s``).
* Permutation and un-permutation: memory-bound; each reads and writes the T input tokens and the
  T*k routed copies once (``Calibration.moe_permute_passes``).
* Experts: each of the E/ep local experts a grouped-GEMM member with m = its tokens, so the GEMM
  efficiency curve (cost/gemm.py, with the grouped GEMM's own half dimension,
  ``Calibration.moe_grouped_gemm_half_dim``) sees tokens per expert: small per-expert batches
  run at a lower fraction of peak; each expert's GEMM also pays a fixed time
  (``Calibration.moe_expert_gemm_s``: one launch and tail per local expert's GEMM); a fused
  grouped MLP (``Calibration.moe_fused_grouped_mlp``) runs at the single GEMM's curve with no
  per-expert time. The busiest rank sets the pace: tokens x ``Calibration.moe_routing_imbalance``
  (1 = force-balanced), capped at the capacity factor when tokens are dropped.
* Dispatch + combine (forward; the backward repeats them), ``TrainingSpec.moe_dispatcher``:
  alltoall: each token copy leaves for its expert's rank, (ep-1)/ep of T*k*W*b bytes each way;
  allgather: every rank all-gathers the group's T*ep tokens and reduce-scatters the outputs back
  (Megatron MoEAllGatherTokenDispatcher), independent of k; flex (DeepEP normal kernels and
  HybridEP, DeepSeek-V3 report Sec. 3.2.2): a token travels once per destination *rank*, not
  once per routed copy (the kernels take the token-to-rank layout, DeepEP
  ``Buffer.get_dispatch_layout``'s ``is_token_in_rank``; HybridEP permutes on the receiving
  rank, "permute + dispatch a2a + permute", Megatron-Core moe/fused_a2a.py), and the combine
  sends back one sum per rank (the rank's own experts' outputs reduced first); across domains it
  crosses the NICs once per destination domain, to the GPU of the same in-domain index there,
  which forwards it over NVLink to the picked ranks. With the k experts distinct and uniform
  (force-balanced routing), a group holding E/m of the E experts is picked with probability
  h(m) = 1 - C(E - E/m, k) / C(E, k) (:func:`group_hit_share`); over the NICs (N-1) h(N)
  copies for N domains, over NVLink the own domain's picked peers, (g-1) h(n), and the
  forwarded ones, (n-g)(g-1)/g h(n): the alltoall's k/n per peer becomes h(n).
  The link is the EP group's (comms.group_link): an EP group spanning domains sends (g-1)/n of
  its copies over NVLink and (n-g)/n over the NICs at once (comms.all_to_all_time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from meshplan.cost import comms
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.expert_load import plan_load_factors
from meshplan.cost.expert_passes import expert_pass_bytes
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import MoeDispatcher, TrainingSpec

ROUTER_LOGIT_BYTES = 4.0
"""The router's logits, softmax and top-k run in fp32 (Megatron-Core router, --moe-router-dtype)."""


@dataclass(frozen=True)
class MoeCost:
    compute_s: np.ndarray
    """Forward: router, permutations, experts, shared experts, latent projections."""
    dispatch_s: np.ndarray
    """Forward dispatch + combine communication over the EP group."""
    kept_width: float
    """Per-token width of the experts' kept activations (k*F + shared F), for the memory."""
    bwd_extra_s: np.ndarray | float = 0.0
    """Backward device time beyond 2x the forward's of the experts' eager passes
    (cost/expert_passes.py: their backward moves other bytes than twice the forward's)."""


def load_factor(training: TrainingSpec, calib: Calibration, model: ModelSpec | None = None,
                plans: PlanArrays | None = None):
    """Tokens of the busiest rank over the mean: the routing imbalance, capped by the capacity
    factor when tokens beyond it are dropped. With the training's expert load (and the model and
    plans to place it on), that load's busiest rank per plan (cost/expert_load.py) instead of the
    calibration's imbalance."""
    if training.expert_load is not None and model is not None and plans is not None:
        return plan_load_factors(training.expert_load, model.moe_num_experts, plans.ep, plans.expert_balanced,
                                 plans.expert_replicas, training.moe_capacity_factor)
    if training.moe_capacity_factor is None:
        return calib.moe_routing_imbalance
    return min(calib.moe_routing_imbalance, training.moe_capacity_factor)


def group_hit_share(num_experts: float, groups, k: float):
    """h(m): the chance that a token's k distinct experts, drawn uniformly from E, pick at least
    one of a group's E/m (m equal groups: the EP ranks, or the scale-up domains they span):
    1 - C(E - E/m, k) / C(E, k) = 1 - prod_{i<k} (E - E/m - i) / (E - i); k/m for k = 1."""
    m = np.maximum(np.asarray(groups, dtype=float), 1.0)
    outside = num_experts - num_experts / m  # experts not in the group
    missed = np.ones_like(m)
    for i in range(int(k)):
        missed = missed * np.maximum(outside - i, 0.0) / (num_experts - i)
    return 1.0 - missed


def dispatch_calibration(calib: Calibration) -> Calibration:
    """The calibration the expert dispatch's link is costed with: HybridEP's own NVLink
    efficiency in place of NCCL's where a preset sets it (Calibration.moe_dispatch_nvlink_efficiency)."""
    if calib.moe_dispatch_nvlink_efficiency <= 0:
        return calib
    return replace(calib, intra_node_comm_efficiency=calib.moe_dispatch_nvlink_efficiency)


def dispatch_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                  calib: Calibration, *, T, ab: float, load: float):
    """Forward dispatch + combine time of one MoE layer (module docstring)."""
    t = plans.tp.astype(float)
    ep = plans.ep.astype(float)
    k = float(model.moe_top_k)
    width = float(model.moe_latent_size or model.hidden_size)  # tokens travel latent
    link = comms.group_link(cluster, dispatch_calibration(calib), plans.ep, plans.etp)  # ep ranks etp apart
    tokens = T / t  # tokens this rank routes (its sequence shard of the TP group)
    if training.moe_dispatcher == MoeDispatcher.ALLGATHER:
        gathered = tokens * ep * width * ab
        return load * (comms.all_gather_time(gathered, ep, link) + comms.reduce_scatter_time(gathered, ep, link))
    copy_bytes = tokens * width * ab  # one copy of this rank's tokens
    if training.moe_dispatcher == MoeDispatcher.FLEX:  # once per picked rank / domain
        E = float(model.moe_num_experts)
        g = comms.domain_members(ep, link)
        domains = ep / g  # scale-up domains the group spans
        remote_domains = (domains - 1.0) * group_hit_share(E, domains, k)
        intra = copy_bytes * group_hit_share(E, ep, k) * ((g - 1.0) + (ep - g) * (g - 1.0) / g)
        return load * 2.0 * comms.split_send_time(intra, copy_bytes * remote_domains, ep, link)
    return load * 2.0 * comms.all_to_all_time(copy_bytes * k, ep, link)


def moe_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
             calib: Calibration, *, T, hbm: float, ab: float, bf16_flops: float, linear_flops: float,
             gemm_time, linear_time) -> MoeCost:
    """One MoE block's forward on one GPU (module docstring). ``linear_time(calib, peak, m, n, k)``
    is a low-precision GEMM with its casts; ``gemm_time`` a plain one (router)."""
    t = plans.tp.astype(float)
    e_t = plans.etp.astype(float)
    ep = plans.ep.astype(float)
    D = float(model.hidden_size)
    E = float(model.moe_num_experts)
    F = float(model.moe_ffn_hidden_size)
    Fs = float(model.moe_shared_ffn_hidden_size)
    k = float(model.moe_top_k)
    m_mlp = 3.0 if model.gated_mlp else 2.0
    load = load_factor(training, calib, model, plans)
    # tokens each local expert sees: an expert-tp group gathers its members' T*etp/t tokens
    tok_in = T * (e_t / t)
    tok_per_expert = tok_in * k * ep / E * load
    Dx = float(model.moe_latent_size or model.hidden_size)  # width the routed experts see
    # grouped GEMM curve and fixed time per local expert GEMM; one fused kernel over all local
    # experts has neither (Calibration.moe_fused_grouped_mlp)
    fused = calib.moe_fused_grouped_mlp
    grouped = calib if fused else replace(
        calib, matmul_half_dim=calib.moe_grouped_gemm_half_dim,
        matmul_efficiency=calib.matmul_efficiency * calib.moe_grouped_gemm_efficiency)
    per_gemm_s = 0.0 if fused else calib.moe_expert_gemm_s
    up = linear_time(grouped, linear_flops, tok_per_expert, (m_mlp - 1) * F / e_t, Dx)
    down = linear_time(grouped, linear_flops, tok_per_expert, Dx, F / e_t)
    t_experts = (E / ep) * (up + down + 2.0 * per_gemm_s)  # one GEMM per local expert
    t_router = gemm_time(calib, bf16_flops, T, E, D) + 2.0 * T * E * ROUTER_LOGIT_BYTES / hbm
    copies = tok_per_expert * E / ep  # routed token copies on this GPU (busiest rank)
    t_permute = calib.moe_permute_passes * 2.0 * 2.0 * (tok_in + copies) * Dx * ab / hbm
    # biased experts' output bias and a clamped GLU's clamp, as separate eager ops (cost/expert_passes.py)
    passes = expert_pass_bytes(model, copies=copies, fc1_width=(m_mlp - 1) * F / e_t, out_width=Dx, ab=ab,
                               fused_mlp=fused)
    t_passes = passes.fwd_bytes / hbm * calib.elementwise_time_factor
    bwd_extra = (passes.bwd_bytes - 2.0 * passes.fwd_bytes) / hbm * calib.elementwise_time_factor
    t_moe = t_experts + t_router + t_permute + t_passes
    if model.moe_latent_size:  # LatentMoE down and up projections (TP-replicated here)
        t_moe = t_moe + linear_time(calib, linear_flops, T, Dx, D) + linear_time(calib, linear_flops, T, D, Dx)
    # shared experts: a dense MLP split over TP
    t_moe = t_moe + model.moe_shared_experts * (linear_time(calib, linear_flops, T, (m_mlp - 1) * Fs / t, D)
                                                + linear_time(calib, linear_flops, T, D, Fs / t))
    return MoeCost(compute_s=t_moe,
                   dispatch_s=dispatch_time(model, cluster, training, plans, calib, T=T, ab=ab, load=load),
                   kept_width=F * k + Fs * model.moe_shared_experts, bwd_extra_s=bwd_extra)

