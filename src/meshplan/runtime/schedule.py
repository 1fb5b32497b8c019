"""The optimizer step's basics: learning-rate schedule, weight-decay groups, gradient clipping.

The schedule is a pure function of the step, so a resumed run recomputes exactly the learning rate
the uninterrupted run had (the checkpoint stores the step, and the optimizer's param_groups hold
the last lr applied).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from meshplan.errors import MeshplanError

log = logging.getLogger(__name__)

CLIP_EPS = 1e-6
"""Added to the norm before dividing (torch.nn.utils.clip_grad_norm_ uses the same)."""
LR_REL_TOL = 1e-9
"""Learning rates closer than this (relative) are the same schedule (float round-off only)."""


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """Linear warmup to ``peak_lr``, then cosine decay to ``min_lr_ratio * peak_lr`` at ``total_steps``
    (Loshchilov and Hutter 2017, SGDR, Eq. 5 without restarts; warmup: Goyal et al. 2017, Sec. 2.2).
    ``cosine=False`` keeps the peak after warmup (the constant schedule of earlier runs)."""

    peak_lr: float
    warmup_steps: int = 0
    total_steps: int
    cosine: bool = False
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not self.peak_lr > 0:
            raise MeshplanError(f"--lr must be positive, got {self.peak_lr}")
        if self.warmup_steps < 0 or self.warmup_steps > self.total_steps:
            raise MeshplanError(f"--warmup-steps must be in 0..{self.total_steps} (--steps), got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise MeshplanError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based)."""
        if step <= self.warmup_steps:
            return self.peak_lr * step / self.warmup_steps
        if not self.cosine or self.total_steps == self.warmup_steps:
            return self.peak_lr
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        floor = self.min_lr_ratio * self.peak_lr
        return floor + 0.5 * (self.peak_lr - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizers: list[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings, none on biases and norm gains (the 1-D tensors),
    as GPT-2/nanoGPT and Llama pre-training do (Loshchilov and Hutter 2019, AdamW)."""
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _expert_group(module: nn.Module):
    return getattr(module, "group", None) if getattr(module, "ep_size", 1) > 1 else None


@torch.no_grad()
def clip_gradients(modules: list[nn.Module], max_norm: float, pp_group) -> float:
    """Scale every gradient so the global L2 norm is at most ``max_norm``; returns the norm before.

    The norm covers each parameter once (Pascanu et al. 2013, Sec. 3.2: clip by the global norm):
    squares of local shards are summed per (mesh, sharded mesh dims) and all-reduced over those
    dims only (replicas are not added twice), expert-parallel slices over their ep group, pipeline
    stages over the pp group; a few collectives per step, not one per parameter."""
    grads: list[torch.Tensor] = []
    partial_sums: dict[tuple, torch.Tensor] = {}  # (group key) -> local sum of squares
    reducers: dict[tuple, list] = {}  # (group key) -> process groups to all-reduce over
    for root in modules:
        for module in root.modules():
            if getattr(module, "etp_size", 1) > 1:
                raise MeshplanError("--clip-grad is not supported with expert tensor parallel")
            ep_group = _expert_group(module)
            for p in module.parameters(recurse=False):
                if p.grad is None:
                    continue
                grads.append(p.grad)
                g = p.grad
                if isinstance(g, DTensor):
                    if any(pl.is_partial() for pl in g.placements):
                        g = g.redistribute(g.device_mesh, [pl if not pl.is_partial() else Replicate()
                                                           for pl in g.placements])
                    # a pp-sharded weight (vocabulary parallelism) is summed over pp with the stages
                    dims = tuple(i for i, pl in enumerate(g.placements)
                                 if pl.is_shard() and (g.device_mesh.mesh_dim_names or ("",))[i] != "pp")
                    key = (id(g.device_mesh), dims, id(ep_group))
                    groups = [g.device_mesh.get_group(i) for i in dims]
                    local = g.to_local()
                else:
                    key, groups, local = ((), (), id(ep_group)), [], g
                if ep_group is not None:
                    groups = [*groups, ep_group]
                sq = local.float().pow(2).sum()
                partial_sums[key] = partial_sums[key] + sq if key in partial_sums else sq
                reducers[key] = groups
    total_sq = torch.zeros((), dtype=torch.float64)
    for key, sq in partial_sums.items():
        for group in reducers[key]:
            dist.all_reduce(sq, group=group)
        total_sq += sq.double().cpu()
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    total = float(total_sq.sqrt())
    if total > max_norm:
        scale = max_norm / (total + CLIP_EPS)
        for g in grads:
            g.mul_(scale)
    return total


def note_schedule_change(optimizers: list[torch.optim.Optimizer], schedule: LRSchedule, step: int) -> None:
    """The checkpoint's optimizer holds the lr its last step used; say so when this run's schedule
    gives another value there (new --lr, --warmup-steps, --cosine or --steps on resume)."""
    saved = optimizers[0].param_groups[0]["lr"]
    now = schedule.lr_at(step)
    if not math.isclose(saved, now, rel_tol=LR_REL_TOL):
        log.warning("the checkpoint's learning rate at step %d was %.6g; this run's schedule gives %.6g there "
                    "(changed --lr, --warmup-steps, --cosine or --steps?)", step, saved, now)


def loop_settings(cfg, job, optimizer: torch.optim.Optimizer, eval_batches: int) -> dict:
    """What the log's summary says about the optimizer step: schedule, clipping, decay groups, data."""
    groups = [{"params": len(g["params"]), "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
    return {"optimizer": job.training.optimizer.value, "peak_lr": cfg.lr, "warmup_steps": cfg.warmup_steps,
            "cosine": cfg.cosine, "min_lr_ratio": cfg.min_lr_ratio, "clip_grad": cfg.clip_grad or None,
            "param_groups": groups, "init_from": cfg.init_from, "tokenizer": cfg.tokenizer,
            "eval_every": cfg.eval_every, "eval_batches": eval_batches}
