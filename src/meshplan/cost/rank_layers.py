"""The layer a pipeline rank is charged for: the kinds of layers it really holds.

:func:`meshplan.cost.layer.layer_cost` averages every kind of layer over the whole stack. Two
kinds cluster on one rank instead of spreading over all of them:

* the leading dense layers of an MoE stack (DeepSeek-V3 report, arXiv 2412.19437, Sec. 4.2:
  "all FFNs except for the first three layers" are MoE; HF ``first_k_dense_replace``,
  ``ModelSpec.moe_dense_layers``). Layer numbering is global, so they sit in virtual stage 0, on
  pipeline rank 0: an 18432-wide SwiGLU MLP, no router, no all-to-all, 0.4B parameters instead
  of 11.3B;
* the multi-token-prediction modules (DeepSeek-V3 Sec. 2.2), on the rank ``Plan.mtp_stage`` (by
  default the last) names: one block (attention + MoE) plus the projection M_k of the
  concatenated [h; Emb] (2D -> D) and its two RMSNorms and output norm.

A rank holding ``lead`` leading dense layers, ``layers - lead`` others and ``mtp`` MTP modules is
charged the count-weighted mix of the three, so ``(layers + mtp)`` times it is the rank's exact
total; the other kinds (sliding windows, hybrid patterns) stay averaged over the rest of the
stack, as they interleave.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import Calibration
from meshplan.cost.gemm import gemm_time
from meshplan.cost.layer import LayerCost, activation_bytes, layer_cost, state_bytes
from meshplan.cost.precision import op_rates
from meshplan.cost.pipeline import rank_of_layer_even
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.layers import layer_kind_counts, mtp_kind
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

_FIELDS = tuple(LayerCost.__dataclass_fields__)


@dataclass(frozen=True)
class StackLayers:
    """The costs a rank's mix is made of, arrays over plans."""

    lead_layers: int
    """Leading layers of their own kind (ModelSpec.moe_dense_layers; 0 for a hybrid pattern)."""
    lead: LayerCost | None
    """One leading dense layer (None: no such layers)."""
    rest: LayerCost
    """The average of the other layers of the main stack."""
    mtp: LayerCost | None
    """One MTP module (None: the model has none)."""


    def take(self, idx) -> StackLayers:
        """The rows ``idx`` of full-length (one entry per plan) costs."""
        pick = lambda c: None if c is None else LayerCost(  # noqa: E731
            **{f: np.asarray(getattr(c, f))[idx] for f in _FIELDS})
        return StackLayers(lead_layers=self.lead_layers, lead=pick(self.lead), rest=pick(self.rest),
                           mtp=pick(self.mtp))


def lead_layers(model: ModelSpec) -> int:
    """Leading dense layers of an MoE stack (a hybrid pattern writes its dense layers as '-')."""
    return 0 if model.hybrid_pattern else model.moe_dense_layers


def needs_rank_mix(model: ModelSpec) -> bool:
    """Whether a rank's layers differ from the stack's average by more than interleaved kinds."""
    return bool(lead_layers(model) or model.mtp_num_layers)


def stack_layers(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
                 calib: Calibration) -> StackLayers:
    d = lead_layers(model)
    lead = None
    if d:
        lead = layer_cost(model, cluster, training, plans, calib, layer_kind_counts(model, 0, d))
        rest = layer_cost(model, cluster, training, plans, calib, layer_kind_counts(model, d))
    else:
        rest = layer_cost(model, cluster, training, plans, calib)
    mtp = _mtp_cost(model, cluster, training, plans, calib) if model.mtp_num_layers else None
    return StackLayers(lead_layers=d, lead=lead, rest=rest, mtp=mtp)


def _mtp_cost(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plans: PlanArrays,
              calib: Calibration) -> LayerCost:
    """One MTP module (DeepSeek-V3 Sec. 2.2, Eq. 21-22): its block as a layer of ``mtp_kind``, plus
    M_k (a 2D -> D linear, split over tp as Megatron's column-parallel eh_proj) on the
    concatenated hidden state and next-token embedding, and three RMSNorms (spec/layers.py's
    mtp_module_params)."""
    block = layer_cost(model, cluster, training, plans, calib, ((mtp_kind(model), 1),))
    D = float(model.hidden_size)
    t = plans.tp.astype(float)
    T = plans.micro_batch * float(training.seq_len) / plans.cp
    rates = op_rates(cluster, training, calib)
    proj_s = gemm_time(calib, rates.linear_flops, T, D / t, 2.0 * D)
    extra_p = (2.0 * D * D + 3.0 * model.norm_params()) / t
    shard = (plans.dp_shard * plans.cp).astype(float)
    ab = activation_bytes(training.precision)
    kept = T * 2.0 * D * ab  # M_k's saved input, [h; Emb]
    return LayerCost(**{
        **{f: getattr(block, f) for f in _FIELDS},
        "fwd_compute_s": block.fwd_compute_s + proj_s,
        "bwd_compute_s": block.bwd_compute_s + 2.0 * proj_s,  # backward = 2x forward (Narayanan 2021)
        "recompute_full_s": block.recompute_full_s + proj_s,
        "params_per_gpu": block.params_per_gpu + extra_p,
        "dense_params_per_gpu": block.dense_params_per_gpu + extra_p,
        "state_bytes": block.state_bytes + state_bytes(calib, training, extra_p, plans.zero, shard),
        "act_none_bytes": block.act_none_bytes + kept,
        "act_selective_bytes": block.act_selective_bytes + kept,
    })


def rank_layer(stack: StackLayers, *, layers, lead, mtp) -> LayerCost:
    """The mix a rank holding ``layers`` layers of the main stack (``lead`` of them leading dense
    layers) and ``mtp`` MTP modules is charged per layer: ``(layers + mtp)`` times it is exact."""
    layers = np.asarray(layers, dtype=float)
    lead = np.asarray(lead, dtype=float)
    mtp = np.asarray(mtp, dtype=float)
    total = layers + mtp
    safe = np.where(total > 0, total, 1.0)
    w_rest = np.where(total > 0, (layers - lead) / safe, 1.0)  # an empty rank: the rest's layer
    parts = [(stack.rest, w_rest)]
    if stack.lead is not None:
        parts.append((stack.lead, lead / safe))
    if stack.mtp is not None:
        parts.append((stack.mtp, mtp / safe))
    return LayerCost(**{f: sum(w * getattr(cost, f) for cost, w in parts) for f in _FIELDS})


def lead_on_rank_even(model: ModelSpec, rank, pp, vpp):
    """Leading dense layers on pipeline ``rank`` under the even split (arrays over plans)."""
    out = np.zeros(np.broadcast(np.asarray(rank), np.asarray(pp), np.asarray(vpp)).shape)
    for j in range(lead_layers(model)):
        out = out + (rank_of_layer_even(j, model.num_layers, pp, vpp) == rank)
    return out


def lead_on_rank(model: ModelSpec, stage_layers: tuple[int, ...], pp: int, rank: int) -> int:
    """Leading dense layers on pipeline ``rank`` of a split into virtual stages ``stage_layers``
    (virtual stage i on rank i % pp)."""
    d, start, n = lead_layers(model), 0, 0
    for i, count in enumerate(stage_layers):
        if i % pp == rank:
            n += max(0, min(d, start + count) - start)
        start += count
    return n


def lead_on_ranks(model: ModelSpec, rank_layers: np.ndarray, vpp) -> np.ndarray:
    """Leading dense layers per rank, (P, pp), of per-rank layer counts ``rank_layers`` (P, pp)
    spread over each rank's ``vpp`` chunks as search/split_scoring.chunk_split spreads them (the last
    chunks take the extra): virtual stage s = chunk * pp + rank, in model order."""
    P, pp = rank_layers.shape
    v = np.broadcast_to(np.asarray(vpp, dtype=np.int64), (P,))[:, None]
    base, extra = np.divmod(rank_layers.astype(np.int64), v)
    out = np.zeros((P, pp))
    left = np.full(P, float(lead_layers(model)))
    for s in range(lead_layers(model)):  # every virtual stage holds a layer at least
        r = s % pp
        chunk = s // pp
        size = base[:, r] + (chunk >= v[:, 0] - extra[:, r]) * 1
        size = np.where(chunk < v[:, 0], size, 0)
        take = np.minimum(left, size)
        out[:, r] += take
        left = left - take
    return out
