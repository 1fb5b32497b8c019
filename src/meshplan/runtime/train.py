"""The training loop, run on every rank inside an initialised process group: set-up (mesh, model,
optimizers, resume), then per step the micro-batches (runtime/microbatch.py), the optimizer update,
the log record and the checkpoint.

Gradient accumulation: ``plan.num_microbatches`` micro-batches of ``plan.micro_batch`` rows.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from meshplan.ckpt_meta import latest_checkpoint
from meshplan.cost.flops import model_flops_per_token
from meshplan.errors import MeshplanError
from meshplan.plan import Job, Plan
from meshplan.runtime.checkpoint import (
    TrainState, kill_for_test, load_checkpoint, pause_for_test, save_checkpoint, should_save,
)
from meshplan.runtime.data import BatchSource, load_text_tokens, local_microbatches
from meshplan.runtime.device import compute_precision, mixed_precision_dtype, pick_device
from meshplan.runtime.lifecycle import RunStopped, StopRequests
from meshplan.runtime.mesh import build_ep_mesh, build_mesh
from meshplan.runtime.metrics import peak_memory_gib
from meshplan.runtime.microbatch import (accumulate, accumulate_documents, loss_context, replicated_value,
                                         token_loss_sum)
from meshplan.runtime.models import build_model
from meshplan.runtime.optim import make_optimizer
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.routing_log import RoutingLog
from meshplan.runtime.schedule import LRSchedule, clip_gradients, decay_groups, loop_settings, note_schedule_change, set_lr
from meshplan.runtime.state import full_parameters
from meshplan.runtime.steplog import LogWriter, ProgressBar, StepRecord
from meshplan.runtime.train_config import TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class _Run:
    """Everything a step needs, built once by :func:`_set_up`."""

    job: Job
    cfg: TrainConfig
    plan: Plan
    device: torch.device
    mesh: object
    source: BatchSource
    modules: list[torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    pipe: object | None
    start_step: int
    start_position: int
    autocast: bool
    amp_dtype: torch.dtype
    flops_per_token: float
    peak_flops: float
    schedule: LRSchedule
    held_out: list = field(default_factory=list)
    """Held-out global batches (inputs, targets) for the eval loss."""
    routing: RoutingLog | None = None
    """Per-step expert counts of a MoE model (runtime/routing_log.py)."""


def train(job: Job, cfg: TrainConfig, stops: StopRequests | None = None) -> list[StepRecord]:
    """Run ``cfg.steps`` optimizer steps of ``job`` on this rank; returns the records (all ranks).

    ``stops``: a SIGTERM/SIGUSR1 seen by any rank ends the run after the current step, with a
    checkpoint when ``cfg.checkpoint_dir`` is set (RunStopped). A loss that is not finite raises
    MeshplanError naming the step.
    """
    run = _set_up(job, cfg)
    d = run.plan.dims
    rank0 = dist.get_rank() == 0
    writer = LogWriter(cfg.log_path if rank0 else None)
    records: list[StepRecord] = []
    progress = ProgressBar(cfg.steps, enabled=rank0 and cfg.progress, done=run.start_step)
    try:
        for step in range(run.start_step + 1, cfg.steps + 1):
            start = time.perf_counter()
            local_loss, grad_norm = _step(run, step)
            pause_for_test(dist.get_rank(), step, stops.requested if stops else lambda: None)
            # Mean over ranks of per-rank means; tp replicas (and non-last pp stages, which add 0)
            # are counted out by dividing by world / pp. The same all-reduce counts stop requests,
            # so every rank agrees on the step it stops after.
            stop_vote = 1.0 if stops is not None and stops.requested() else 0.0
            total = torch.stack([local_loss.detach().float().reshape(()),
                                 torch.tensor(stop_vote, device=run.device)])
            dist.all_reduce(total)
            loss = total[0].item() / (dist.get_world_size() / d.pp)
            if not math.isfinite(loss):
                raise MeshplanError(f"the loss is {loss} at step {step}: training diverged "
                                    f"(lower --lr, currently {cfg.lr:g})")
            imbalance = run.routing.collect(step) if run.routing else None  # a collective, every rank
            rec = _record(run, step, loss, start, grad_norm=grad_norm,
                          eval_loss=_maybe_eval(run, step), expert_imbalance=imbalance)
            records.append(rec)
            writer.write(rec)
            progress.advance(rec)
            stopping = total[1].item() > 0 and step < cfg.steps  # at the last step: just finish
            saved = _maybe_save(run, step, force=stopping)
            if stopping:
                _stop(run, step, saved, stops)
    finally:
        progress.close()
        if run.routing:
            run.routing.close()
    writer.summary(records, run.plan.notation(), d.world_size, loop=loop_settings(run.cfg, run.job, run.optimizers[0], len(run.held_out)))
    if cfg.state_out:
        _save_state(run.modules, job, run.mesh, cfg.state_out)
    return records


def _set_up(job: Job, cfg: TrainConfig) -> _Run:
    """Process group, mesh, data, the parallelised model (or pipeline stages), optimizers, resume."""
    plan = job.full_plan
    d, training = plan.dims, job.training
    device = pick_device(job)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=cfg.collective_timeout_s))
    if dist.get_world_size() != d.world_size:
        raise MeshplanError(f"the plan needs {d.world_size} processes, torchrun started {dist.get_world_size()}")
    mesh = build_mesh(plan, device.type)
    ep_mesh = build_ep_mesh(plan, device.type)
    source, held_out = _data_source(job, cfg)
    compute = compute_precision(training.precision, device)
    mp_dtype = mixed_precision_dtype(compute)
    if cfg.eval_every and d.pp > 1:
        raise MeshplanError("--eval-every is not supported with pipeline parallel (pp > 1)")

    model = build_model(job.model, "meta")

    def init_stage(module: torch.nn.Module) -> None:
        module.init_device = device
        module.init_weights(cfg.seed)

    pipe = None
    if d.pp > 1:
        from meshplan.runtime.pipeline import build_pipeline

        pipe = build_pipeline(
            model, plan, mesh, device=device,
            loss_fn=lambda logits, y: token_loss_sum(logits, y) / y.numel(),
            parallelize_stage=lambda m: parallelize(m, plan, mesh, ep_mesh=ep_mesh, param_dtype=mp_dtype),
            init_stage=init_stage, n_microbatches=plan.num_microbatches(training),
        )
        modules = pipe.model_parts
    else:
        parallelize(model, plan, mesh, ep_mesh=ep_mesh, param_dtype=mp_dtype)
        init_stage(model)
        modules = [model]
    resuming = cfg.resume and cfg.checkpoint_dir and latest_checkpoint(cfg.checkpoint_dir) is not None
    if cfg.init_from and not resuming:
        from meshplan.runtime.hf_weights import load_hf_weights

        load_hf_weights(modules, cfg.init_from, job.model)
    # One optimizer per model part (virtual pipeline stages): AdamW/SGD are per-parameter, so this
    # equals one optimizer over all, and checkpoints key each part's state by its own FQNs.
    optimizers = [make_optimizer(job, decay_groups(m, cfg.weight_decay) if cfg.weight_decay else list(m.parameters()),
                                 cfg.lr) for m in modules]
    start_step, start_position = 0, 0
    if resuming:
        resumed = load_checkpoint(cfg.checkpoint_dir, job=job, model_parts=modules, optimizers=optimizers)
        start_step, start_position = resumed.step, resumed.data_position
        if resumed.data_seed != source.seed:  # keep the run's data order, whatever --seed says now
            source = replace(source, seed=resumed.data_seed)
    schedule = LRSchedule(peak_lr=cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps,
                          cosine=cfg.cosine, min_lr_ratio=cfg.min_lr_ratio)
    if start_step and dist.get_rank() == 0:
        note_schedule_change(optimizers, schedule, start_step)
    return _Run(job=job, cfg=cfg, plan=plan, device=device, mesh=mesh, source=source, modules=modules,
                optimizers=optimizers, pipe=pipe, start_step=start_step, start_position=start_position,
                autocast=mp_dtype is not None,
                amp_dtype=mp_dtype or torch.bfloat16,
                flops_per_token=model_flops_per_token(job.model, training.seq_len),
                peak_flops=job.cluster.gpu.peak_flops(compute) if device.type == "cuda" else 0.0,
                schedule=schedule,
                held_out=held_out,
                routing=RoutingLog(job.model, modules, tp=d.tp, pp=d.pp, device=device, path=cfg.expert_load_log)
                if job.model.is_moe else None)


def _data_source(job: Job, cfg: TrainConfig):
    """(training batches, held-out batches): packed tokenizer data, byte text or synthetic tokens."""
    training = job.training
    if training.seq_len_dist is not None:  # packed variable-length documents (runtime/packing.py)
        from meshplan.runtime.packing import DocumentSource

        return DocumentSource(dist=training.seq_len_dist, seq_len=training.seq_len,
                              global_batch=training.global_batch, vocab_size=job.model.vocab_size,
                              seed=cfg.seed, balance=training.doc_balance), []
    if cfg.tokenizer:
        from meshplan.runtime.datasets import load_packed

        packed = load_packed(cfg.data, cfg.tokenizer, seq_len=training.seq_len,
                             global_batch=training.global_batch, vocab_size=job.model.vocab_size,
                             seed=cfg.seed, eval_fraction=cfg.eval_fraction)
        return packed, packed.eval_batches(cfg.eval_batches)
    text = load_text_tokens(cfg.data, job.model.vocab_size, training.seq_len) if cfg.data else None
    return BatchSource(seq_len=training.seq_len, global_batch=training.global_batch,
                       vocab_size=job.model.vocab_size, seed=cfg.seed, text=text), []


def _step(run: _Run, step: int) -> torch.Tensor:
    """Forward, backward and optimizer update of one step; returns this rank's mean loss (detached)."""
    plan, training, device = run.plan, run.job.training, run.device
    d = plan.dims
    dp_rank = run.mesh["dp"].get_local_rank()
    cp_rank = run.mesh["cp"].get_local_rank()
    rows_per_rank = training.global_batch // d.dp
    for optimizer in run.optimizers:
        optimizer.zero_grad(set_to_none=True)
    if training.seq_len_dist is not None:  # pp = cp = 1 (targets.py)
        local_loss = accumulate_documents(run.modules[0], plan, run.source.rank_batch(step, dp_rank, d.dp),
                                           device, run.autocast, run.amp_dtype)
    elif run.pipe is not None:
        tokens, targets = run.source.batch(step)
        x, y = local_microbatches(tokens, targets, dp_rank=dp_rank, dp=d.dp,
                                  micro_batch=rows_per_rank, cp_rank=cp_rank, cp=d.cp)[0]
        with torch.autocast(device.type, dtype=run.amp_dtype, enabled=run.autocast), loss_context(plan):
            out = run.pipe.step(x.to(device), y.to(device))
        local_loss = replicated_value(out.detach()).float() if out is not None else torch.zeros((), device=device)
    else:
        tokens, targets = run.source.batch(step)
        local_tokens = rows_per_rank * training.seq_len // d.cp
        local_loss = accumulate(run.modules[0], plan, tokens, targets, dp_rank, cp_rank,
                                 local_tokens, device, run.autocast, run.amp_dtype)
    kill_for_test(dist.get_rank(), step)
    grad_norm = (clip_gradients(run.modules, run.cfg.clip_grad, run.mesh["pp"].get_group() if d.pp > 1 else None)
                 if run.cfg.clip_grad else None)
    set_lr(run.optimizers, run.schedule.lr_at(step))
    for optimizer in run.optimizers:
        optimizer.step()
    return local_loss, grad_norm


def _record(run: _Run, step: int, loss: float, start: float, *, grad_norm: float | None = None,
            eval_loss: float | None = None, expert_imbalance: list[float] | None = None) -> StepRecord:
    """The step's log record (``start``: its perf_counter at the beginning): time, throughput,
    the fullest rank's peak memory, MFU on GPU."""
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    elapsed_s = time.perf_counter() - start
    peak = torch.tensor([peak_memory_gib(run.device)], device=run.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the fullest rank is the one that matters
    tps = run.job.training.tokens_per_step / elapsed_s
    world = run.plan.dims.world_size
    mfu = (run.flops_per_token * tps / (world * run.peak_flops)) if run.peak_flops else None
    return StepRecord(step=step, loss=loss, step_time_s=elapsed_s, tokens_per_s=tps,
                      peak_memory_gib=float(peak.item()), mfu=mfu, lr=run.schedule.lr_at(step),
                      grad_norm=grad_norm, eval_loss=eval_loss,
                      expert_imbalance=tuple(expert_imbalance) if expert_imbalance is not None else None)


@torch.no_grad()
def _maybe_eval(run: _Run, step: int) -> float | None:
    """Mean held-out loss over ``run.held_out`` every ``eval_every`` steps and after the last one
    (the same token-mean as the training loss, forward only)."""
    cfg, plan = run.cfg, run.plan
    if not cfg.eval_every or not run.held_out or not (step % cfg.eval_every == 0 or step == cfg.steps):
        return None
    d = plan.dims
    dp_rank, cp_rank = run.mesh["dp"].get_local_rank(), run.mesh["cp"].get_local_rank()
    local_tokens = run.job.training.global_batch // d.dp * run.job.training.seq_len // d.cp
    total = torch.zeros((), device=run.device)
    model = run.modules[0]
    for tokens, targets in run.held_out:
        for x, y in local_microbatches(tokens, targets, dp_rank=dp_rank, dp=d.dp, micro_batch=plan.micro_batch,
                                       cp_rank=cp_rank, cp=d.cp):
            with loss_context(plan), torch.autocast(run.device.type, dtype=run.amp_dtype, enabled=run.autocast):
                total += replicated_value(token_loss_sum(model(x.to(run.device)), y.to(run.device))).float() / local_tokens
    dist.all_reduce(total)
    return total.item() / dist.get_world_size() / len(run.held_out)


def _maybe_save(run: _Run, step: int, *, force: bool) -> Path | None:
    """Save on the configured schedule (or ``force``) when the run has a checkpoint directory."""
    cfg = run.cfg
    if not cfg.checkpoint_dir or not (force or should_save(step, cfg.checkpoint_every, cfg.steps)):
        return None
    position = run.start_position + (step - run.start_step) * run.job.training.global_batch
    state = TrainState(step=step, data_position=position, data_seed=run.source.seed)
    return save_checkpoint(cfg.checkpoint_dir, state=state, job=run.job, model_parts=run.modules,
                           optimizers=run.optimizers, keep=cfg.checkpoint_keep)


def _stop(run: _Run, step: int, saved: Path | None, stops: StopRequests | None) -> None:
    """End the run on a stop request, after step ``step`` (its checkpoint already written)."""
    why = (stops.requested() if stops else None) or "a stop request on another rank"
    if saved is not None:
        msg = f"stopped by {why} after step {step}: checkpoint {saved} saved; continue with --resume"
    else:
        msg = f"stopped by {why} after step {step}: nothing saved (no --checkpoint-dir)"
    if dist.get_rank() == 0:
        log.info("%s", msg)  # the launcher prints it as the run's last line
    raise RunStopped(msg)


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
