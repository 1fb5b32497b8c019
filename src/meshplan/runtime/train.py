"""The training loop, run on every rank inside an initialised process group.

Loss: mean next-token cross-entropy over every token of the global batch. Each rank computes the
sum over its tokens divided by its own token count; data-parallel gradient averaging (over
dp_replicate x dp_shard x cp) then yields the global mean, identical to one process.
Gradient accumulation: ``plan.num_microbatches`` micro-batches of ``plan.micro_batch`` rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshplan.ckpt_meta import latest_checkpoint
from meshplan.cost.flops import model_flops_per_token
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.runtime.checkpoint import (
    TrainState, kill_for_test, load_checkpoint, save_checkpoint, should_save,
)
from meshplan.runtime.data import BatchSource, load_text_tokens, local_microbatches
from meshplan.runtime.mesh import build_ep_mesh, build_mesh
from meshplan.runtime.metrics import peak_memory_gib
from meshplan.runtime.models import build_model
from meshplan.runtime.parallelize import parallelize, set_gradient_sync
from meshplan.runtime.state import full_parameters
from meshplan.spec.training import Optimizer, Precision

log = logging.getLogger(__name__)

ADAM_BETAS = (0.9, 0.95)
"""AdamW betas of GPT-3 / Llama pre-training (Brown et al. 2020, App. B)."""
WEIGHT_DECAY = 0.0
"""No weight decay by default: short runs and parity tests stay easy to reason about."""
SGD_MOMENTUM = 0.9


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 10
    lr: float = 1e-3
    seed: int = 0
    data: str | None = None
    """Local text file (byte tokens); None means synthetic tokens."""
    log_path: str | None = None
    """JSON lines: one object per step, then a summary object (written by rank 0)."""
    state_out: str | None = None
    """Save the full final weights (canonical name -> tensor) here (rank 0), for tests."""
    progress: bool = True
    checkpoint_dir: str | None = None
    """Write sharded checkpoints under this directory (meshplan.runtime.checkpoint)."""
    checkpoint_every: int = 0
    """Save every this many steps, and after the last step; 0 never saves."""
    checkpoint_keep: int | None = None
    """Complete checkpoints to keep (None keeps all)."""
    resume: bool = False
    """Continue from the latest complete checkpoint in ``checkpoint_dir`` (when it has one);
    ``steps`` stays the total, so a run resumed at step 40 of 100 runs steps 41..100."""


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    step: int
    loss: float
    step_time_s: float
    tokens_per_s: float
    peak_memory_gib: float
    mfu: float | None = None


def pick_device(job: Job) -> torch.device:
    """CPU processes for the `cpu` cluster or without CUDA; else this rank's GPU."""
    if job.cluster.gpu.name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        log.warning("no CUDA device: running the %s plan on CPU processes", job.cluster.gpu.name)
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def compute_precision(precision: Precision, device: torch.device) -> Precision:
    """Matmul precision actually used: fp32 on CPU; on GPU the Job's, with fp8 run as bf16
    (this runtime has no fp8 matmuls; the log's MFU is then measured against the bf16 peak)."""
    if device.type != "cuda":
        return Precision.FP32
    if precision == Precision.FP8:
        log.warning("fp8 matmuls are not implemented by the runtime: training in bf16")
        return Precision.BF16
    return precision


def make_optimizer(job: Job, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    opt = job.training.optimizer
    if opt == Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    wd = WEIGHT_DECAY if opt == Optimizer.ADAMW else 0.0
    return torch.optim.AdamW(params, lr=lr, betas=ADAM_BETAS, weight_decay=wd)


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of cross-entropy over the (B, S) tokens; logits (B, S, V), or under tp a DTensor
    sharded on V (then inside ``loss_context``)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")


def replicated_value(t: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor: under loss_parallel it is a DTensor replicated over tp."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def loss_context(plan) -> contextlib.AbstractContextManager:
    """torch's loss_parallel when the LM head is tensor parallel (its logits are vocab-sharded
    DTensors, see parallelize.apply_tp); forward and backward of the loss must both run inside."""
    if plan.dims.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def train(job: Job, cfg: TrainConfig) -> list[StepRecord]:
    """Run ``cfg.steps`` optimizer steps of ``job`` on this rank; returns the records (all ranks)."""
    plan = job.plan.with_defaults(job.model)
    d, training = plan.dims, job.training
    device = pick_device(job)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != d.world_size:
        raise MeshplanError(f"the plan needs {d.world_size} processes, torchrun started {dist.get_world_size()}")
    mesh = build_mesh(plan, device.type)
    ep_mesh = build_ep_mesh(plan, device.type)
    text = load_text_tokens(cfg.data, job.model.vocab_size, training.seq_len) if cfg.data else None
    source = BatchSource(seq_len=training.seq_len, global_batch=training.global_batch,
                         vocab_size=job.model.vocab_size, seed=cfg.seed, text=text)
    compute = compute_precision(training.precision, device)
    autocast = compute != Precision.FP32
    amp_dtype = torch.float16 if compute == Precision.FP16 else torch.bfloat16

    model = build_model(job.model, "meta")
    rows_per_rank = training.global_batch // d.dp
    local_tokens = rows_per_rank * training.seq_len // d.cp

    def init_stage(module: torch.nn.Module) -> None:
        module.init_device = device
        module.init_weights(cfg.seed)

    pipe = None
    if d.pp > 1:
        from meshplan.runtime.pipeline import build_pipeline

        pipe = build_pipeline(
            model, plan, mesh, device=device,
            loss_fn=lambda logits, y: token_loss_sum(logits, y) / y.numel(),
            parallelize_stage=lambda m: parallelize(m, plan, mesh, ep_mesh=ep_mesh),
            init_stage=init_stage, n_microbatches=plan.num_microbatches(training),
        )
        modules = list(pipe.stage_modules)
    else:
        parallelize(model, plan, mesh, ep_mesh=ep_mesh)
        init_stage(model)
        modules = [model]
    # One optimizer per model part (virtual pipeline stages): AdamW/SGD are per-parameter, so this
    # equals one optimizer over all, and checkpoints key each part's state by its own FQNs.
    optimizers = [make_optimizer(job, list(m.parameters()), cfg.lr) for m in modules]
    start_step, start_position = 0, 0
    if cfg.resume and cfg.checkpoint_dir and latest_checkpoint(cfg.checkpoint_dir) is not None:
        resumed = load_checkpoint(cfg.checkpoint_dir, job=job, model_parts=modules, optimizers=optimizers)
        start_step, start_position = resumed.step, resumed.data_position
        if resumed.data_seed != source.seed:  # keep the run's data order, whatever --seed says now
            source = replace(source, seed=resumed.data_seed)

    dp_rank = mesh["dp"].get_local_rank()
    cp_rank = mesh["cp"].get_local_rank()
    flops_per_token = model_flops_per_token(job.model, training.seq_len)
    peak_flops = job.cluster.gpu.peak_flops(compute) if device.type == "cuda" else 0.0
    rank0 = dist.get_rank() == 0
    writer = _LogWriter(cfg.log_path if rank0 else None)
    records: list[StepRecord] = []
    progress = _Progress(cfg.steps, enabled=rank0 and cfg.progress)
    try:
        for step in range(start_step + 1, cfg.steps + 1):
            tokens, targets = source.batch(step)
            start = time.perf_counter()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            if pipe is not None:
                x, y = local_microbatches(tokens, targets, dp_rank=dp_rank, dp=d.dp,
                                          micro_batch=rows_per_rank, cp_rank=cp_rank, cp=d.cp)[0]
                with torch.autocast(device.type, dtype=amp_dtype, enabled=autocast), loss_context(plan):
                    out = pipe.step(x.to(device), y.to(device))
                local_loss = replicated_value(out.detach()).float() if out is not None else torch.zeros((), device=device)
            else:
                local_loss = _accumulate(model, plan, tokens, targets, dp_rank, cp_rank,
                                         local_tokens, device, autocast, amp_dtype)
            kill_for_test(dist.get_rank(), step)
            for optimizer in optimizers:
                optimizer.step()
            # Mean over ranks of per-rank means; tp replicas (and non-last pp stages, which add 0)
            # are counted out by dividing by world / pp.
            total = local_loss.detach().clone().reshape(1)
            dist.all_reduce(total)
            loss = total.item() / (dist.get_world_size() / d.pp)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            peak = torch.tensor([peak_memory_gib(device)], device=device)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the fullest rank is the one that matters
            tps = training.tokens_per_step / elapsed
            mfu = (flops_per_token * tps / (d.world_size * peak_flops)) if peak_flops else None
            rec = StepRecord(step=step, loss=loss, step_time_s=elapsed, tokens_per_s=tps,
                             peak_memory_gib=float(peak.item()), mfu=mfu)
            records.append(rec)
            writer.write(rec)
            progress.advance(rec)
            if cfg.checkpoint_dir and should_save(step, cfg.checkpoint_every, cfg.steps):
                position = start_position + (step - start_step) * training.global_batch
                state = TrainState(step=step, data_position=position, data_seed=source.seed)
                save_checkpoint(cfg.checkpoint_dir, state=state, job=job, model_parts=modules,
                                optimizers=optimizers, keep=cfg.checkpoint_keep)
    finally:
        progress.close()
    writer.summary(records, plan.notation(), d.world_size)
    if cfg.state_out:
        _save_state(modules, job, mesh, cfg.state_out)
    return records


def _accumulate(model, plan, tokens, targets, dp_rank, cp_rank, local_tokens, device, autocast, amp_dtype):
    """Forward/backward over this rank's micro-batches; returns the rank's mean loss (detached)."""
    d = plan.dims
    mbs = local_microbatches(tokens, targets, dp_rank=dp_rank, dp=d.dp, micro_batch=plan.micro_batch,
                             cp_rank=cp_rank, cp=d.cp)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(mbs):
        last = i == len(mbs) - 1
        # zero 0/1: reduce once per step (like DDP no_sync / ZeRO-1); zero 2/3: every micro-batch.
        set_gradient_sync(model, last or plan.zero >= 2)
        with loss_context(plan):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=autocast):
                logits = model(x.to(device))
            loss = token_loss_sum(logits, y.to(device)) / local_tokens
            loss.backward()
        total += replicated_value(loss.detach())
    return total


def _save_state(modules, job: Job, mesh, path: str) -> None:
    """Gather the full weights; the ranks holding each pipeline stage's (dp, cp, tp) = 0 copy send it."""
    tied = job.model.tied_embeddings
    state = full_parameters(modules, tied)
    representative = all(mesh[a].get_local_rank() == 0 for a in ("dp_replicate", "dp_shard", "cp", "tp"))
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, state if representative else {})
    if dist.get_rank() == 0:
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part or {})
        torch.save(merged, path)


class _LogWriter:
    def __init__(self, path: str | None) -> None:
        self.file = open(path, "w") if path else None

    def write(self, rec: StepRecord) -> None:
        if self.file:
            self.file.write(json.dumps(asdict(rec)) + "\n")
            self.file.flush()

    def summary(self, records: list[StepRecord], notation: str, world: int) -> None:
        if not self.file:
            return
        steady = records[1:] or records  # the first step pays for warm-up
        mfus = [r.mfu for r in steady if r.mfu is not None]
        self.file.write(json.dumps({
            "summary": True, "steps": len(records), "plan": notation, "world_size": world,
            "first_loss": records[0].loss if records else None,
            "final_loss": records[-1].loss if records else None,
            "mean_step_time_s": sum(r.step_time_s for r in steady) / max(1, len(steady)),
            "mean_tokens_per_s": sum(r.tokens_per_s for r in steady) / max(1, len(steady)),
            "peak_memory_gib": max((r.peak_memory_gib for r in records), default=0.0),
            "mfu": sum(mfus) / len(mfus) if mfus else None,
        }) + "\n")
        self.file.close()


class _Progress:
    """rich progress bar on rank 0 (stderr), showing the latest loss."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                console=Console(stderr=True))
            self.task = self.bar.add_task("train", total=total, info="")
            self.bar.start()

    def advance(self, rec: StepRecord) -> None:
        if self.bar:
            self.bar.update(self.task, advance=1,
                            info=f"loss {rec.loss:.4f}  {rec.tokens_per_s:,.0f} tok/s")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()
