"""What every rank of a plan would build, without building it (no torch): ``meshplan train --dry-run``.

For each chosen rank: its place on the device mesh (the ranks of each of its groups, as torch's
``init_device_mesh`` lays them out: ``torch.arange(world).view(pp, dp_replicate, dp_shard, cp, tp)``,
and the expert mesh ``(pp, dp_replicate, edp, ep, tp)`` of runtime/mesh.py), the virtual pipeline
stages it holds (the layer ranges of ``pipeline_check.stage_layer_ranges``, the runtime's own split;
embedding on the first stage, final norm + head + loss on the last), the parameters of those stages
and the share tensor and expert parallelism and FSDP (ZeRO-3) leave on the rank, next to the cost
model's memory for the rank's pipeline stage (``estimate()``: what ``meshplan estimate --plan``
prints). Everything is closed-form in the layer counts (``spec.layers.layer_kind_counts``), so a
plan of 16,384 ranks or 10^8 layers answers at once; ``--dry-run --simulate`` runs the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost import Calibration, estimate
from meshplan.cost.step import Estimate
from meshplan.plan import Job, Offload, Plan
from meshplan.plan.choices import MESH_AXIS_ORDER
from meshplan.runtime.pipeline_check import stage_layer_ranges
from meshplan.spec.cluster import GIB
from meshplan.spec.layers import Ffn, kind_params, layer_kind_counts, moe_params, mtp_kind
from meshplan.spec.model import ModelSpec

EXPERT_AXES = ("pp", "dp_replicate", "edp", "ep", "etp")
"""Axes of the expert mesh, outermost first: a stage's dp_shard x cp x tp ranks seen as
edp x ep x etp (ParallelDims.etp; runtime/mesh.build_ep_mesh, where etp is tp)."""


@dataclass(frozen=True)
class AxisGroup:
    """The ranks that share every coordinate but ``axis`` with a rank: ``first_rank + k * stride``."""

    axis: str
    size: int
    index: int
    """The rank's coordinate on ``axis``."""
    first_rank: int
    stride: int

    def ranks_text(self) -> str:
        last = self.first_rank + (self.size - 1) * self.stride
        if self.size == 1:
            return str(self.first_rank)
        if self.size == 2:
            return f"{self.first_rank},{last}"
        if self.stride == 1:
            return f"{self.first_rank}-{last}"
        return f"{self.first_rank},{self.first_rank + self.stride},..,{last} (every {self.stride})"

    def to_dict(self) -> dict:
        return {"axis": self.axis, "size": self.size, "index": self.index, "first_rank": self.first_rank,
                "stride": self.stride, "ranks": self.ranks_text()}


@dataclass(frozen=True)
class StageBuild:
    """One virtual pipeline stage as the runtime cuts it (runtime/pipeline.cut_stage)."""

    stage: int
    first_layer: int
    num_layers: int
    embedding: bool
    head: bool
    mtp_modules: int
    params: float
    """Its parameters, unsharded (embedding, layers, MTP modules, final norm and head)."""
    expert_params: int
    """Of ``params``: the routed experts (split by ep x etp, not tp)."""

    def to_dict(self) -> dict:
        return {"stage": self.stage, "layers": self.layers_text(), "first_layer": self.first_layer,
                "num_layers": self.num_layers, "embedding": self.embedding, "head": self.head,
                "mtp_modules": self.mtp_modules, "params": self.params, "expert_params": self.expert_params}

    def layers_text(self) -> str:
        if not self.num_layers:
            return "-"
        return f"{self.first_layer}-{self.first_layer + self.num_layers - 1}"


@dataclass(frozen=True)
class RankBuild:
    """What one rank would build, next to the cost model's memory of its pipeline stage."""

    rank: int
    world_size: int
    coords: dict[str, int]
    groups: tuple[AxisGroup, ...]
    stages: tuple[StageBuild, ...]
    held_params: float
    """Parameters on this rank: dense / tp, experts / (ep x etp), and, under ZeRO-3, the dense
    ones / (dp_shard x cp) and the experts / edp as well (FSDP2 over dp_shard_cp; norms, replicated
    under tp, are counted divided: a few hidden_size vectors per layer)."""
    layout_weight_bytes: float
    """``held_params`` at the calibration's weight bytes per parameter."""
    weights_on_host: bool
    """The plan offloads the parameter shards (``Offload.PARAMS``): they live in host memory, and
    the cost model's device weights are then only what is gathered."""
    model_memory: dict[str, float]
    """The cost model's breakdown for this rank's pipeline stage, bytes (estimate().stages);
    ``weight_shard_bytes`` is its weights less OSDP's groups kept gathered beyond their shards
    (``kept_weight_bytes``): the like-for-like figure of ``layout_weight_bytes``."""
    gpu_memory_bytes: float

    @property
    def fits(self) -> bool:
        return self.model_memory["total_bytes"] <= self.gpu_memory_bytes

    def to_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "coords": self.coords,
                "groups": [g.to_dict() for g in self.groups], "stages": [s.to_dict() for s in self.stages],
                "held_params": self.held_params, "layout_weight_bytes": self.layout_weight_bytes,
                "weights_on_host": self.weights_on_host,
                "cost_model_memory": self.model_memory, "gpu_memory_bytes": self.gpu_memory_bytes,
                "fits": self.fits}


def _unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinates of ``rank`` (torch.arange(world).view(shape))."""
    coords = []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(reversed(coords))


def _groups(rank: int, names: tuple[str, ...], shape: tuple[int, ...]) -> list[AxisGroup]:
    coords = _unravel(rank, shape)
    out = []
    for i, (name, size) in enumerate(zip(names, shape)):
        stride = 1
        for later in shape[i + 1:]:
            stride *= later
        out.append(AxisGroup(axis=name, size=size, index=coords[i], first_rank=rank - coords[i] * stride,
                             stride=stride))
    return out


def rank_groups(plan: Plan, rank: int) -> tuple[AxisGroup, ...]:
    """The rank's group on every mesh axis, then on the expert mesh's edp and ep (and etp when it
    is not tp) when ep > 1."""
    d = plan.dims
    groups = _groups(rank, tuple(a.value for a in MESH_AXIS_ORDER), d.mesh_shape)
    if d.ep > 1:
        shape = (d.pp, d.dp_replicate, d.expert_dp, d.ep, d.expert_tp)
        expert = ("edp", "ep") + (("etp",) if d.expert_tp != d.tp else ())
        groups += [g for g in _groups(rank, EXPERT_AXES, shape) if g.axis in expert]
    return tuple(groups)


def _layer_params(model: ModelSpec, lo: int, hi: int) -> tuple[int, int]:
    """(all, routed-expert) parameters of layers lo..hi-1, closed-form per run of layer kinds."""
    total = experts = 0
    routed = moe_params(model, False)[1] if model.is_moe else 0
    for kind, n in layer_kind_counts(model, lo, hi):
        total += n * kind_params(model, kind)
        if kind.ffn == Ffn.MOE:
            experts += n * routed
    return total, experts


def stage_builds(job: Job, stages: list[int]) -> list[StageBuild]:
    """The virtual stages ``stages`` as the runtime cuts them (embedding first, head last; under
    vocabulary parallelism both are spread over every pipeline rank instead)."""
    model, plan = job.model, job.full_plan
    ranges = stage_layer_ranges(plan, model.num_layers)
    last = plan.num_stages - 1
    mtp_stage = last if plan.mtp_stage is None else plan.mtp_stage
    out = []
    for s in stages:
        r = ranges[s]
        params, experts = _layer_params(model, r.start, r.stop)
        first, is_last = s == 0, s == last
        mtp = model.mtp_num_layers if s == mtp_stage else 0
        if mtp:
            params += model.mtp_params()
            if mtp_kind(model).ffn == Ffn.MOE:
                experts += mtp * moe_params(model, False)[1]
        if plan.vocab_parallel:  # Lamy-Poirier et al. 2023 / runtime/vocab_parallel.py: 1/pp of each
            params += (model.embedding_params() + model.head_params()) / plan.num_stages
        else:
            # The embedding's rows sit on the first stage; also on the last when a tied head needs
            # its own copy (runtime/tied_embedding.TiedEmbedding: synced at start, gradients all-reduced),
            # and on the MTP stage, which Megatron-Core builds with the embedding and output layer
            # (GPTModel's mtp_process; cost/batch.py charges the same copies).
            if first or mtp:
                params += model.embedding_params()
            elif model.tied_embeddings and is_last:  # the token table only, as the LM head
                params += model.vocab_size * model.hidden_size
            if is_last or mtp:
                params += model.head_params()
        out.append(StageBuild(stage=s, first_layer=r.start, num_layers=len(r), embedding=first, head=is_last,
                              mtp_modules=mtp, params=params, expert_params=experts))
    return out


def held_params(plan: Plan, stages: list[StageBuild]) -> float:
    """Parameters left on one rank of these stages by tp, ep x etp and (ZeRO-3) FSDP."""
    d = plan.dims
    dense = sum(s.params - s.expert_params for s in stages) / d.tp
    experts = sum(s.expert_params for s in stages) / (d.ep * d.expert_tp)
    if plan.zero >= 3:
        dense /= d.dp_shard * d.cp
        experts /= d.expert_dp
    return dense + experts


def layout(job: Job, ranks: list[int], calib: Calibration) -> tuple[Estimate, list[RankBuild]]:
    """Each of ``ranks`` as the runtime would build it, with ``estimate()``'s memory of its stage."""
    plan = job.full_plan
    est = estimate(job.model, job.cluster, job.training, job.plan, calib)
    out = []
    for rank in ranks:
        groups = rank_groups(plan, rank)
        coords = {g.axis: g.index for g in groups}
        pp_rank = coords["pp"]
        stages = stage_builds(job, [s for s in range(plan.num_stages) if plan.stage_rank(s) == pp_rank])
        mem = est.stages[pp_rank].memory
        held = held_params(plan, stages)
        out.append(RankBuild(
            rank=rank, world_size=plan.dims.world_size, coords=coords, groups=groups, stages=tuple(stages),
            held_params=held, layout_weight_bytes=held * calib.weight_bytes_per_param,
            weights_on_host=Offload.PARAMS in plan.offload,
            model_memory={"parameters_bytes": mem.parameters_bytes, "gradients_bytes": mem.gradients_bytes,
                          "optimizer_bytes": mem.optimizer_bytes, "activations_bytes": mem.activations_bytes,
                          "other_bytes": mem.other_bytes, "total_bytes": mem.total_bytes,
                          "kept_weight_bytes": mem.kept_weight_bytes,
                          "weight_shard_bytes": mem.parameters_bytes - mem.kept_weight_bytes},
            gpu_memory_bytes=est.gpu_memory_gib * GIB))
    return est, out
