"""Forward and backward over one rank's micro-batches, and the loss they sum.

Loss: mean next-token cross-entropy over every token of the global batch. Each rank computes the
sum over its tokens divided by its own token count; data-parallel gradient averaging (over
dp_replicate x dp_shard x cp) then yields the global mean, identical to one process.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from meshplan.plan import Offload
from meshplan.runtime.data import local_microbatches
from meshplan.runtime.osdp import head_loss_context
from meshplan.runtime.parallelize import set_accumulation


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


def activation_offload(plan, device: torch.device) -> contextlib.AbstractContextManager:
    """Tensors saved for backward go to host memory in the forward and come back in the backward
    (``Offload.ACTIVATIONS``; torch.autograd.graph.save_on_cpu, pinned on a GPU so the copies can
    be asynchronous). On a CPU run they are already on the host: the hooks run, nothing moves."""
    if Offload.ACTIVATIONS not in plan.offload:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


def accumulate(model, plan, tokens, targets, dp_rank, cp_rank, local_tokens, device, autocast, amp_dtype):
    """Forward/backward over this rank's micro-batches; returns the rank's mean loss (detached)."""
    d = plan.dims
    mbs = local_microbatches(tokens, targets, dp_rank=dp_rank, dp=d.dp, micro_batch=plan.micro_batch,
                             cp_rank=cp_rank, cp=d.cp)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(mbs):
        last = i == len(mbs) - 1
        # zero 0/1: reduce once per step (like DDP no_sync / ZeRO-1); zero 2/3: every micro-batch.
        set_accumulation(model, plan, last)
        with loss_context(plan):
            with (torch.autocast(device.type, dtype=amp_dtype, enabled=autocast), activation_offload(plan, device),
                  head_loss_context(model, y.to(device))):
                out = model(x.to(device))  # the loss sum with a chunked LM head (runtime.osdp)
            loss = (out if out.dim() == 0 else token_loss_sum(out, y.to(device))) / local_tokens
            loss.backward()
        total += replicated_value(loss.detach())
    return total


def accumulate_documents(model, plan, batch, device, autocast, amp_dtype):
    """``accumulate`` for packed documents: each micro-batch's document layout is set on the
    attention cores before its forward; the loss is over the targets of the whole global batch."""
    from meshplan.runtime.packing import set_documents

    per_rank_targets = batch.global_targets / plan.dims.dp  # the dp average makes it the global mean
    rows = range(0, batch.tokens.shape[0], plan.micro_batch)
    total = torch.zeros((), device=device)
    for i, r in enumerate(rows):
        set_accumulation(model, plan, i == len(rows) - 1)
        set_documents(model, batch.documents[r:r + plan.micro_batch])
        x, y = batch.tokens[r:r + plan.micro_batch], batch.targets[r:r + plan.micro_batch]
        with loss_context(plan):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=autocast), activation_offload(plan, device):
                logits = model(x.to(device))
            loss = token_loss_sum(logits, y.to(device)) / per_rank_targets
            loss.backward()
        total += replicated_value(loss.detach())
    set_documents(model, None)
    return total
