"""The optimizer of a training run: AdamW (or SGD) with the pre-training defaults named below."""

from __future__ import annotations

import torch

from meshplan.plan import Job
from meshplan.runtime.train_config import WEIGHT_DECAY
from meshplan.spec.training import Optimizer

ADAM_BETAS = (0.9, 0.95)
"""AdamW betas of GPT-3 / Llama pre-training (Brown et al. 2020, App. B)."""
SGD_MOMENTUM = 0.9


def make_optimizer(job: Job, params: list, lr: float, weight_decay: float = WEIGHT_DECAY) -> torch.optim.Optimizer:
    """``params``: parameters, or param groups (runtime/schedule.decay_groups) whose own
    weight_decay wins over ``weight_decay``."""
    opt = job.training.optimizer
    if opt == Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    wd = weight_decay if opt == Optimizer.ADAMW else 0.0
    return torch.optim.AdamW(params, lr=lr, betas=ADAM_BETAS, weight_decay=wd)
