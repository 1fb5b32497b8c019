"""Pipeline parallel: split a meta model into the plan's (virtual) stages and run torch's schedules.

Order of work in :func:`build_pipeline` (the runtime's train loop calls it when ``pp > 1``):
1. cut: one deep copy of the meta model per virtual stage held by this pipeline rank, with the
   layers of other stages deleted from ``layers`` (a ModuleDict, so the remaining FQNs such as
   ``layers.5.attention.wq.weight`` are the same as in the whole model); embeddings only on the
   first stage, final norm and output projection only on the last (with vocabulary parallelism
   the embedding and the output projection leave the stages: meshplan.runtime.vocab_parallel);
2. the runtime's ``parallelize_stage`` (TP, CP, AC, FSDP/DDP on the stage module) then
   ``init_stage`` (materialise on the device, deterministic init by FQN);
3. tied embeddings (GPT-2): the last stage keeps its own copy of the embedding matrix as
   ``output.weight``; it is made equal to the first stage's at start and both receive the sum of
   the two gradients after every step (meshplan.runtime.tied_embedding);
4. one ``PipelineStage`` per local virtual stage over the ``pp`` sub-mesh's process group, and the
   schedule the plan names.

Gradient scaling: ``loss_fn`` returns the mean over one micro-batch's tokens; the schedule divides
the accumulated gradients by ``n_microbatches`` (``scale_grads=True``), so with equal micro-batches
gradients equal those of the mean loss over this DP rank's whole batch, as in the non-PP path;
data-parallel averaging is left to FSDP/DDP as there.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.stage import stage_backward
from torch.distributed.tensor import DTensor
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    _PipelineSchedule,
)

from meshplan.errors import MeshplanError
from meshplan.plan import MeshAxis, Plan, Schedule
from meshplan.runtime.mesh import data_parallel_mesh
from meshplan.runtime.pipeline_check import (
    ZERO_BUBBLE_RECOMPUTE,
    local_stage_indices,
    stage_layer_keys,
)
from meshplan.runtime.tied_embedding import TiedEmbedding, has_tied_embeddings, local_part, tied_pair_groups
from meshplan.runtime.vocab_parallel import VOCAB_PARALLEL_SCHEDULES, VocabParallel, VocabShards, pipeline_groups
from meshplan.targets import VOCAB_PARALLEL_SCHEDULE

_SINGLE_STAGE_SCHEDULES = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}
_MULTI_STAGE_SCHEDULES = {
    Schedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B,
    # ZB1P of Qi et al. 2024 (arXiv 2401.10241), on the looped placement the plan uses.
    # ScheduleZBVZeroBubble would need the V placement (rank r holds stages r and 2pp-1-r).
    Schedule.ZERO_BUBBLE: ScheduleInterleavedZeroBubble,
}


class ZeroStage(PipelineStage):
    """A PipelineStage whose FSDP2 stage module keeps, between micro-batches, what the plan's ZeRO
    stage keeps (the cost model's per-stage states), not what torch's PipelineStage does.

    torch's stage turns off resharding after backward and gradient reduction for every micro-batch
    until the schedule's end (its ``perform_reduce_grad``), so from its first backward a stage
    would hold all its gathered weights and unsharded fp32 gradients. Here, for full backwards:
    zero 3 frees the gathered weights after each micro-batch's backward and reduce-scatters its
    gradients (Rajbhandari et al. 2020, Sec. 5.3); zero 2 reduces every micro-batch and keeps the
    16-bit weights whole; zero 0/1 keep both and reduce at the end (torch's behaviour). Under HSDP
    zero 2/3 all-reduce over the replicas once, on the last micro-batch's backward. The
    zero-bubble schedule's split backward (input, then weight) keeps torch's behaviour: a weight
    backward needs the gathered weights after the input backward."""

    def __init__(self, *args, zero: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.zero = zero

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        from torch.distributed.fsdp import FSDPModule

        if backward_type != "full" or not isinstance(self.submod, FSDPModule) or self.zero < 2:
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        self.submod.set_is_last_backward(False)  # the schedule's perform_reduce_grad finalises
        self.submod.set_reshard_after_backward(self.zero == 3)
        self.submod.set_requires_gradient_sync(True)
        # After gradient sync, which resets it: HSDP sums the reduce-scattered shards over the
        # micro-batches and all-reduces them over the replicas on the last one only (FSDP2's
        # set_requires_all_reduce; foreach_reduce's partial_reduce_output), as the non-pipeline
        # path (parallelize.set_accumulation) and the cost model (cost/dp_comm.py) do.
        self.submod.set_requires_all_reduce(last_backward)
        grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"], bwd_kwargs["input_values"])
        return grads, None


def cut_stage(model_meta: nn.Module, layer_keys: list[str], *, is_first: bool, is_last: bool,
              vocab_parallel: bool = False) -> nn.Module:
    """A deep copy of ``model_meta`` holding only ``layer_keys``, embeddings/head only at the ends
    (token embedding and head on no stage with ``vocab_parallel``: the first stage then takes
    hidden states and the last returns them)."""
    stage = copy.deepcopy(model_meta)
    keep = set(layer_keys)
    for key in list(stage.layers.keys()):
        if key not in keep:
            del stage.layers[key]
    if not is_first or vocab_parallel:
        stage.tok_embeddings = None
    if not is_first and getattr(stage, "pos_embeddings", None) is not None:
        stage.pos_embeddings = None
    if not is_last:
        stage.norm = None
    if not is_last or vocab_parallel:
        stage.output = None
    return stage


@dataclass
class PipelineRuntime:
    """The stages this rank runs and the schedule that drives them (see module docstring)."""

    stage_modules: list[nn.Module]
    """This rank's stage modules, in model order (virtual stages ``pp_rank, pp_rank + pp, ...``)."""
    stage_indices: list[int]
    num_stages: int
    micro_batch: int
    make_schedule: Callable[[int], _PipelineSchedule]
    pp_group: dist.ProcessGroup
    n_microbatches: int | None = None
    tied: TiedEmbedding | None = None
    tied_copy_names: tuple[str, ...] = field(default=())
    """FQNs on this rank that are copies of a weight owned elsewhere (``output.weight`` of a tied
    model on the last stage): checkpoints should save the owner's value only."""
    vocab: VocabParallel | None = None
    """This rank's vocabulary shards and their collectives (``plan.vocab_parallel``)."""
    _schedule: _PipelineSchedule | None = None

    @property
    def model_parts(self) -> list[nn.Module]:
        """What the optimizer, checkpoints and full weights cover: the stages and the vocabulary shards."""
        return [*self.stage_modules, *([self.vocab.shards] if self.vocab is not None else [])]

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    @property
    def schedule(self) -> _PipelineSchedule:
        if self._schedule is None:
            if self.n_microbatches is None:
                raise MeshplanError("the pipeline schedule is built on the first step (n_microbatches unknown)")
            self._schedule = self.make_schedule(self.n_microbatches)
        return self._schedule

    def step(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        """Forward and backward of one batch (B, S) split into ``n_microbatches`` along B.

        Returns the mean loss over the batch's tokens on ranks holding the last stage, else None.
        Gradients are left in the parameters' ``.grad`` (already reduced over data parallel).
        """
        if (self.has_first_stage or self.vocab is not None) and tokens is None:
            raise MeshplanError("the first pipeline stage (every stage with vocab_parallel) needs the input tokens")
        if (self.has_last_stage or self.vocab is not None) and targets is None:
            raise MeshplanError("the last pipeline stage (every stage with vocab_parallel) needs the targets")
        if self.n_microbatches is None:
            batch = tokens if tokens is not None else targets
            if batch is None:
                raise MeshplanError("pass n_microbatches to build_pipeline, or the batch to every rank")
            if batch.shape[0] % self.micro_batch:
                raise MeshplanError(
                    f"batch of {batch.shape[0]} sequences is not a multiple of micro_batch={self.micro_batch}"
                )
            self.n_microbatches = batch.shape[0] // self.micro_batch
        first_input = self.vocab.begin(tokens, targets) if self.vocab is not None else tokens
        args = (first_input,) if self.has_first_stage else ()
        target = targets if self.has_last_stage else None
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        if self.tied is not None:
            self.tied.all_reduce_grad()
        vocab_loss = self.vocab.finish() if self.vocab is not None else None
        if not self.has_last_stage:
            return None
        if vocab_loss is not None:
            return vocab_loss
        # Each micro-batch loss is a mean over equally many tokens: their mean is the batch mean.
        return torch.stack([loss.detach() for loss in losses]).mean()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters of every local stage with the whole model's FQNs (unique across stages)."""
        seen: set[int] = set()
        for module in self.stage_modules:
            for name, p in module.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield name, p

    def parameters(self) -> Iterator[nn.Parameter]:
        for _, p in self.named_parameters():
            yield p

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the global L2 norm over all stages (each tied weight counted once); returns it."""
        if self.vocab is not None:
            raise MeshplanError("clip vocabulary-parallel pipelines with runtime.schedule.clip_gradients "
                                "(its norm counts the pp-sharded vocabulary rows once)")
        owned = [p for n, p in self.named_parameters() if n not in self.tied_copy_names]
        sq = grad_sq_norm(owned)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.pp_group)
        total = sq.sqrt()
        # Same coefficient as torch.nn.utils.clip_grad_norm_; applied to the local shards because
        # DTensor foreach ops refuse the plain-tensor coefficient.
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for p in self.parameters():
                if p.grad is not None:
                    local_part(p.grad).mul_(coef.to(p.grad.device))
        return total


def grad_sq_norm(params: list[nn.Parameter]) -> torch.Tensor:
    """Sum of squared gradient entries over ``params``, complete over their DP/TP shards.

    DTensor gradients are grouped by (mesh, placements) so each group needs one reduction.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = p.grad
            key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else (None, ())
            groups.setdefault(key, []).append(g)
    total = torch.zeros((), dtype=torch.float32)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total = total + norm.float().cpu() ** 2
    return total.to(params[0].device if params else "cpu")


def build_pipeline(
    model_meta: nn.Module,
    plan: Plan,
    mesh: DeviceMesh,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    parallelize_stage: Callable[[nn.Module], nn.Module],
    init_stage: Callable[[nn.Module], None],
    n_microbatches: int | None = None,
    make_stage: Callable[..., PipelineStage] | None = None,
) -> PipelineRuntime:
    """Cut ``model_meta`` into this rank's stages, parallelise and materialise them, build the schedule.

    ``n_microbatches`` is ``plan.num_microbatches(training)``; when left out it is taken from the
    first batch given to ``step`` (its rows / ``plan.micro_batch``), which every rank must then get.
    ``make_stage`` builds each stage (``PipelineStage``'s signature); by default a
    :class:`ZeroStage` following ``plan.zero``; the dry run passes one that states the stages'
    shapes up front (meshplan.runtime.dryrun).
    """
    if make_stage is None:
        make_stage = functools.partial(ZeroStage, zero=plan.zero)
    if n_microbatches is not None and n_microbatches < 1:
        raise MeshplanError(f"n_microbatches must be positive, got {n_microbatches}")
    pp = plan.dims.pp
    if pp < 2:
        raise MeshplanError(f"build_pipeline needs pp > 1, the plan has pp={pp}")
    pp_mesh = mesh[MeshAxis.PP.value]
    pp_rank = pp_mesh.get_local_rank()
    pp_group = pp_mesh.get_group()
    keys = stage_layer_keys(plan, len(model_meta.layers))
    n_stages = plan.num_stages
    local = local_stage_indices(plan, pp_rank)
    tied_model = has_tied_embeddings(model_meta) and not plan.vocab_parallel  # else tied in the shards

    modules: list[nn.Module] = []
    for s in local:
        stage = cut_stage(model_meta, keys[s], is_first=s == 0, is_last=s == n_stages - 1,
                          vocab_parallel=plan.vocab_parallel)
        stage = parallelize_stage(stage)
        init_stage(stage)
        modules.append(stage)

    tied = None
    tied_names: tuple[str, ...] = ()
    if tied_model:
        # All ranks must join the creation of every pair group, owners or not.
        pairs, groups = tied_pair_groups(_all_pp_rows(mesh))
        me = dist.get_rank()
        for pair, group in zip(pairs, groups):
            if me in pair:
                if 0 in local:
                    weight = modules[local.index(0)].tok_embeddings.weight
                else:
                    weight = modules[local.index(n_stages - 1)].output.weight
                    tied_names = ("output.weight",)
                tied = TiedEmbedding(group=group, src_rank=pair[0], weight=weight)
        if tied is not None:
            tied.sync_weight()

    if plan.schedule == Schedule.ZERO_BUBBLE:
        # Decided over the whole pipeline: a rank that refused alone would leave the others hanging.
        flag = torch.tensor([float(any(_uses_composable_checkpoint(m) for m in modules))], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=pp_group)
        if flag.item():
            raise MeshplanError(ZERO_BUBBLE_RECOMPUTE)
    vocab = _build_vocab(model_meta, plan, mesh, local, n_microbatches, init_stage) if plan.vocab_parallel else None
    stages = [
        make_stage(m, s, n_stages, device, group=pp_group) for m, s in zip(modules, local)
    ]
    return PipelineRuntime(
        stage_modules=modules,
        stage_indices=local,
        num_stages=n_stages,
        micro_batch=plan.micro_batch,
        make_schedule=lambda n_mb: _make_schedule(plan, stages, n_mb, loss_fn, vocab),
        pp_group=pp_group,
        n_microbatches=n_microbatches,
        tied=tied,
        tied_copy_names=tied_names,
        vocab=vocab,
    )


def _build_vocab(model_meta: nn.Module, plan: Plan, mesh: DeviceMesh, local: list[int],
                 n_microbatches: int | None, init_stage: Callable[[nn.Module], None]) -> VocabParallel:
    """This rank's vocabulary shards, materialised like a stage, and their process groups."""
    if n_microbatches is None:
        raise MeshplanError("vocab_parallel needs n_microbatches given to build_pipeline")
    shards = VocabShards(model_meta.spec, mesh[MeshAxis.PP.value])
    dp_cp = mesh["dp_cp"]
    if dp_cp.size() > 1 and plan.zero >= 1:  # ZeRO as the stages: FSDP2 over the data-parallel ranks
        from torch.distributed.fsdp import fully_shard

        fully_shard(shards, mesh=data_parallel_mesh(mesh, plan), reshard_after_forward=plan.zero == 3)
        # zero 1/2: gathered once per step, kept over the step's passes (VocabParallel.finish reshards)
        shards.set_reshard_after_backward(plan.zero == 3)
    init_stage(shards)
    me = dist.get_rank()
    row, group = next((r, g) for r, g in pipeline_groups(_all_pp_rows(mesh)) if me in r)
    return VocabParallel(shards=shards, group=group, first_rank=row[0], last_rank=row[-1],
                         is_first=0 in local, is_last=plan.num_stages - 1 in local,
                         dp_group=dp_cp.get_group() if dp_cp.size() > 1 and plan.zero == 0 else None,
                         n_microbatches=n_microbatches)


def _uses_composable_checkpoint(module: nn.Module) -> bool:
    """True if a submodule carries torch.distributed._composable.checkpoint's hooks."""
    from torch.distributed._composable import checkpoint

    return any(checkpoint.state(m) is not None for m in module.modules())


def _all_pp_rows(mesh: DeviceMesh) -> torch.Tensor:
    """Every pipeline of the world mesh as a row of global ranks ordered by pp rank: (N/pp, pp)."""
    names = list(mesh.mesh_dim_names or ())
    full = mesh.mesh
    pp_dim = names.index(MeshAxis.PP.value)
    return full.movedim(pp_dim, -1).reshape(-1, full.shape[pp_dim])


def _make_schedule(
    plan: Plan, stages: list[PipelineStage], n_microbatches: int, loss_fn: Callable,
    vocab: VocabParallel | None = None,
) -> _PipelineSchedule:
    try:
        if vocab is not None:
            if plan.schedule.value not in VOCAB_PARALLEL_SCHEDULES or len(stages) != 1:
                raise MeshplanError(VOCAB_PARALLEL_SCHEDULE)
            return VOCAB_PARALLEL_SCHEDULES[plan.schedule.value](stages[0], n_microbatches, vocab)
        if plan.schedule in _SINGLE_STAGE_SCHEDULES:
            if len(stages) != 1:
                raise MeshplanError(f"{plan.schedule.value} runs one stage per rank (vpp=1)")
            cls = _SINGLE_STAGE_SCHEDULES[plan.schedule]
            return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
        cls = _MULTI_STAGE_SCHEDULES[plan.schedule]
        return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    except ValueError as exc:  # torch's own limits, e.g. too few micro-batches
        raise MeshplanError(f"pipeline schedule {plan.schedule.value}: {exc}") from None
