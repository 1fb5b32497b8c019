"""Dry run: one rank of a plan at its real world size, on torch's fake process group and fake tensors.

``simulate_rank(job, rank)`` makes this process rank ``rank`` of ``world_size`` on the "fake"
backend (collectives return at once and move nothing: torch.testing._internal.distributed.fake_pg),
then follows the runtime's own path (meshplan.runtime.train): the DeviceMesh, the meta model,
``parallelize`` (TP/SP, CP, EP, recompute, FSDP2/HSDP/replicate) or ``build_pipeline`` (stages,
schedule), the optimizer, and ``steps`` full training steps (forward, backward, the pipeline
schedule's sends and receives, optimizer step). Weights are materialised under ``FakeTensorMode``
instead of ``init_weights``: shapes, dtypes and placements without storage or FLOPs.

What a rank holds: parameter, gradient and optimizer-state bytes by summing the rank-local tensors
(``DTensor.to_local()``), and the peak of torch's ``MemTracker`` (every tensor allocated through the
dispatcher, by category) over the steps. What it sends: ``CollectiveCounter`` (dryrun_comms).

Where the real path cannot run on fake tensors, a reference path is taken and named in
docs/dryrun.md: MoE routing is balanced (dryrun_moe), and the pipeline's warm-up vote (a 4-byte
p2p exchange whose value a fake process group cannot carry) is decided locally as "static shapes",
the shapes being given to every stage up front.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor

from meshplan.plan import Job, Plan
from meshplan.runtime.dryrun_comms import (
    CollectiveCounter,
    CollectiveTally,
    axis_of_groups,
)
from meshplan.runtime.dryrun_kernels import use_fused_norm_kernels
from meshplan.runtime.dryrun_moe import use_balanced_routing
from meshplan.runtime.dryrun_tracker import (
    ShardingPropagation,
    marking_sharding_propagation,
    step_tracker,
)
from meshplan.runtime.mesh import build_ep_mesh, build_mesh
from meshplan.runtime.models import build_model
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.pipeline import ZeroStage
from meshplan.runtime.device import compute_precision, mixed_precision_dtype
from meshplan.runtime.microbatch import accumulate, loss_context, token_loss_sum
from meshplan.runtime.optim import make_optimizer

DRY_RUN_LR = 1e-3
"""Learning rate of the simulated optimizer (its value changes nothing a dry run measures)."""


@dataclass(frozen=True)
class RankResult:
    """What one simulated rank holds and sends (bytes are per rank)."""

    rank: int
    world_size: int
    coords: dict[str, int]
    """This rank's index on every mesh axis (pp, dp_replicate, dp_shard, cp, tp)."""
    stages: list[int]
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    peak_bytes: int
    """MemTracker's peak of all tracked tensors (allocated, not reserved) over the steps."""
    peak_by_category: dict[str, int]
    peak_origins: list[dict]
    """What was live at the peak by (category, module, op, dtype), largest first (dryrun_tracker.PeakOrigin)."""
    peak_at: str
    """Phase (forward, backward, optimizer) and innermost module when the peak was reached."""
    collectives: list[CollectiveTally]
    """Per (kind, axis), over the last step."""
    microbatches: int
    steps: int
    wall_s: float
    reference_paths: list[str] = field(default_factory=list)
    """Pieces that ran a reference path instead of the runtime's (see docs/dryrun.md)."""

    def to_dict(self) -> dict:
        return asdict(self)


class _StaticShapeStage(ZeroStage):
    """A PipelineStage told its shapes up front. torch's warm-up vote sends a 4-byte int between
    neighbours to agree on static vs dynamic shapes; on a fake process group the value never arrives,
    so the vote is decided here: every stage of a dry run is static."""

    def _warmup_forward_vote(self, has_backward, received_acc=None):
        return torch.tensor([1], dtype=torch.int32)  # under FakeTensorMode: a constant, .item() works

    def _warmup_backward_result(self, received_result=None):
        return torch.tensor([1], dtype=torch.int32)


def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _unique_params(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def _optimizer_bytes(optimizers: list[torch.optim.Optimizer]) -> int:
    return sum(_local_bytes(v) for opt in optimizers for state in opt.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))


def _materialise(fake: FakeTensorMode, module: nn.Module) -> None:
    """``to_empty`` on fake CPU tensors; a tied LM head is tied again if the move untied it.

    (init_parameters swaps tensors to keep the tie, but torch refuses to swap a tensor that a
    weak reference points to, which fake-tensor conversion leaves on some parameters.)"""
    from meshplan.runtime.tied_embedding import has_tied_embeddings

    tied = has_tied_embeddings(module)
    with fake:
        module.to_empty(device="cpu")
    if tied and module.output.weight is not module.tok_embeddings.weight:
        module.output.weight = module.tok_embeddings.weight


def _mesh_views(mesh, ep_mesh) -> dict:
    names = ["tp", "cp", "dp_shard", "dp_replicate", "pp", "dp_shard_cp", "dp", "dp_cp"]
    views = {n: mesh[n] for n in names}
    if ep_mesh is not None:
        views.update({"ep": ep_mesh["ep"], "edp": ep_mesh["edp"], "dp_edp": ep_mesh["dp_edp"]})
    return views


def simulate_rank(job: Job, rank: int, steps: int = 1) -> RankResult:
    """Run ``steps`` training steps of ``job`` as rank ``rank`` on the fake process group."""
    start = time.perf_counter()
    plan = job.full_plan
    # Importing fake_pg registers the "fake" backend with torch.distributed.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.dims.world_size)
    try:
        return _simulate(job, plan, rank, steps, start)
    finally:
        dist.destroy_process_group()


def _simulate(job: Job, plan: Plan, rank: int, steps: int, start: float) -> RankResult:
    d, training = plan.dims, job.training
    mesh, ep_mesh = build_mesh(plan, "cpu"), build_ep_mesh(plan, "cpu")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    device = torch.device("cpu")
    # Matmul precision of the plan's GPU run (fp8 runs as bf16 there too), autocast on CPU here.
    mp_dtype = mixed_precision_dtype(compute_precision(training.precision, torch.device("cuda")))
    amp_dtype, autocast = mp_dtype or torch.bfloat16, mp_dtype is not None
    reference: list[str] = []

    def parallelize_stage(module: nn.Module) -> nn.Module:
        parallelize(module, plan, mesh, ep_mesh=ep_mesh, param_dtype=mp_dtype)
        if use_balanced_routing(module) and "moe-routing" not in reference:
            reference.append("moe-routing")
        if use_fused_norm_kernels(module) and "fused-norm-kernel" not in reference:
            reference.append("fused-norm-kernel")
        return module

    model = build_model(job.model, "meta")
    rows = training.global_batch // d.dp  # this data-parallel rank's sequences per step
    # The pipeline takes this rank's rows and sequence chunk (train.py slices them before
    # pipe.step); the non-pipeline path slices the global batch itself (microbatch.accumulate).
    shape = (rows, training.seq_len // d.cp) if d.pp > 1 else (training.global_batch, training.seq_len)
    with fake:
        tokens = torch.randint(0, job.model.vocab_size, shape)
        targets = torch.randint(0, job.model.vocab_size, shape)
    pipe = None
    if d.pp > 1:
        from meshplan.runtime.pipeline import build_pipeline

        reference.append("pipeline-warmup-vote")
        pipe = build_pipeline(
            model, plan, mesh, device=device,
            loss_fn=lambda logits, y: token_loss_sum(logits, y) / y.numel(),
            parallelize_stage=parallelize_stage, init_stage=lambda m: _materialise(fake, m),
            n_microbatches=plan.num_microbatches(training),
            make_stage=_stage_factory(job, plan, fake, autocast, amp_dtype),
        )
        modules = pipe.model_parts
        stages = list(pipe.stage_indices)
        tied_group = pipe.tied.group if pipe.tied is not None else None
    else:
        parallelize_stage(model)
        _materialise(fake, model)
        modules, stages, tied_group = [model], [0], None
    optimizers = [make_optimizer(job, list(m.parameters()), DRY_RUN_LR) for m in modules]

    propagation = ShardingPropagation()
    tracker = step_tracker(propagation)
    tracker.track_external(*modules, *optimizers)
    dp_rank, cp_rank = mesh["dp"].get_local_rank(), mesh["cp"].get_local_rank()
    grads_bytes = 0
    axes = axis_of_groups(_mesh_views(mesh, ep_mesh))
    if tied_group is not None:
        axes[tied_group.group_name] = "pp_tied"  # first and last stage: tied embedding gradient
    if pipe is not None and pipe.vocab is not None:
        axes[pipe.vocab.group.group_name] = "pp_vocab"  # vocabulary parallelism's reduces and broadcasts
    counter = CollectiveCounter(axes)
    with fake, marking_sharding_propagation(propagation), tracker:
        for step in range(1, steps + 1):
            counting = counter if step == steps else contextlib.nullcontext()
            with counting:
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                if pipe is not None:
                    with torch.autocast("cpu", dtype=amp_dtype, enabled=autocast), loss_context(plan):
                        pipe.step(tokens, targets)
                else:
                    local_tokens = rows * training.seq_len // d.cp
                    accumulate(model, plan, tokens, targets, dp_rank, cp_rank, local_tokens,
                                device, autocast, amp_dtype)
                grads_bytes = sum(_local_bytes(p.grad) for p in _unique_params(modules))
                for opt in optimizers:
                    opt.step()
    peak = tracker.get_tracker_snapshot("peak").get(device, {})
    by_cat = {str(getattr(k, "value", k)): int(v) for k, v in peak.items()}
    coords = {a: mesh[a].get_local_rank() for a in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
    return RankResult(
        rank=rank, world_size=d.world_size, coords=coords, stages=stages,
        parameters_bytes=sum(_local_bytes(p) for p in _unique_params(modules)),
        gradients_bytes=grads_bytes, optimizer_bytes=_optimizer_bytes(optimizers),
        peak_bytes=by_cat.pop("Total", sum(by_cat.values())), peak_by_category=by_cat,
        peak_origins=[o.to_dict() for o in tracker.peak_origins()], peak_at=tracker.peak_at(),
        collectives=counter.tallies(), microbatches=plan.num_microbatches(training), steps=steps,
        wall_s=time.perf_counter() - start, reference_paths=reference)


def _stage_factory(job: Job, plan: Plan, fake: FakeTensorMode, autocast: bool, amp_dtype: torch.dtype):
    """make_stage for build_pipeline: each stage's input and output shapes, found by one forward
    of the (fake) stage on a micro-batch; non-first stages take the hidden states (b, S/cp[/tp], D)."""
    d, training, spec = plan.dims, job.training, job.model
    seq = training.seq_len // d.cp
    hidden_seq = seq // d.tp if (plan.sp and d.tp > 1) else seq
    # Hidden states between stages are in the compute dtype: under FSDP2 mixed precision the
    # embedding and the blocks compute with 16-bit weight copies, so the residual stream is 16-bit.
    hidden_dtype = amp_dtype if autocast else torch.float32

    def make(module: nn.Module, index: int, num_stages: int, device: torch.device, *, group) -> PipelineStage:
        with fake:
            if index == 0 and not plan.vocab_parallel:  # else hidden states (runtime/vocab_parallel.py)
                x = torch.randint(0, spec.vocab_size, (plan.micro_batch, seq))
            else:
                x = torch.empty(plan.micro_batch, hidden_seq, spec.hidden_size, dtype=hidden_dtype,
                                requires_grad=True)  # its gradient goes back to the previous stage
            with torch.no_grad(), torch.autocast("cpu", dtype=amp_dtype, enabled=autocast):
                y = module(x)
        _reshard(module)
        out = y if index == num_stages - 1 else torch.empty_like(y, requires_grad=True)
        return _StaticShapeStage(module, index, num_stages, device, input_args=x,
                                 output_args=out, group=group, zero=plan.zero)

    return make


def _reshard(module: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
