"""Test worker: trains a tiny LM under a Job's plan with meshplan checkpoints, under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node N _ckpt_worker.py config.json

The model is deliberately the checkpoint module's own fixture (embedding, residual MLP blocks in a
``layers`` ModuleDict, norm, head), parallelised with FSDP2 over ``dp_shard`` and Megatron TP
(colwise w1, rowwise w2) over ``tp``, so the checkpoint tests do not depend on the runtime's models.
Data is a deterministic function of (data_seed, step): the global batch of every step is the same
under every plan; each data-parallel rank takes its contiguous slice.

config keys: job, steps, ckpt_dir, every, keep, resume, losses (JSONL, appended by rank 0 each step),
weights (full state dict written by rank 0 at the end), kill_rank/kill_step (that rank SIGKILLs
itself between forward and backward of that step).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from meshplan import ckpt_meta
from meshplan.plan import MESH_AXIS_ORDER, Job
from meshplan.runtime.checkpoint import TrainState, load_checkpoint, save_checkpoint, should_save


class Block(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, S, D) -> (B, S, D)
        return h + self.w2(F.gelu(self.w1(h)))


class TinyLM(nn.Module):
    def __init__(self, d: int, f: int, v: int, num_layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(v, d)
        self.layers = nn.ModuleDict({str(i): Block(d, f) for i in range(num_layers)})
        self.norm = nn.LayerNorm(d)
        self.output = nn.Linear(d, v, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S) ids -> (B, S, V) logits
        h = self.tok_embeddings(x)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def build(job: Job, seed: int):
    plan, spec = job.plan, job.model
    if plan.dims.pp > 1 or plan.dims.cp > 1 or plan.dims.dp_replicate > 1:
        raise SystemExit("worker supports dp_shard and tp only")
    mesh = init_device_mesh("cpu", plan.dims.mesh_shape, mesh_dim_names=[a.value for a in MESH_AXIS_ORDER])
    torch.manual_seed(seed)  # same full weights under every plan, then sharded
    model = TinyLM(spec.hidden_size, spec.ffn_hidden_size, spec.vocab_size, spec.num_layers)
    if plan.dims.tp > 1:
        for block in model.layers.values():
            parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    if plan.dims.dp_shard > 1:
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    return mesh, model, opt


def batch(step: int, data_seed: int, job: Job) -> torch.Tensor:
    """The global batch of one step, (B, S+1) token ids, the same under every plan."""
    g = torch.Generator().manual_seed(data_seed * 1_000_003 + step)
    return torch.randint(job.model.vocab_size, (job.training.global_batch, job.training.seq_len + 1), generator=g)


def main(config_path: str) -> None:
    cfg = json.loads(open(config_path).read())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    job = Job.load(cfg["job"])
    mesh, model, opt = build(job, seed=0)
    dp, dp_rank = mesh["dp_shard"].size(), mesh["dp_shard"].get_local_rank()
    state = TrainState(step=0, data_position=0, data_seed=7)
    if cfg.get("resume") and ckpt_meta.latest_checkpoint(cfg["ckpt_dir"]) is not None:
        state = load_checkpoint(cfg["ckpt_dir"], job=job, model_parts=model, optimizers=opt)
    for step in range(state.step + 1, cfg["steps"] + 1):
        tokens = batch(step, state.data_seed, job)
        rows = job.training.global_batch // dp
        local = tokens[dp_rank * rows:(dp_rank + 1) * rows]
        logits = model(local[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), local[:, 1:].flatten())
        if step == cfg.get("kill_step") and rank == cfg.get("kill_rank"):
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
        opt.zero_grad()
        reported = loss.detach().clone()
        dist.all_reduce(reported, group=mesh["dp_shard"].get_group())
        state = TrainState(step=step, data_position=state.data_position + job.training.global_batch,
                           data_seed=state.data_seed)
        if rank == 0:
            with open(cfg["losses"], "a") as fh:
                fh.write(json.dumps({"step": step, "loss": (reported / dp).item()}) + "\n")
        if should_save(step, cfg.get("every"), cfg["steps"]):
            save_checkpoint(cfg["ckpt_dir"], state=state, job=job, model_parts=model, optimizers=opt,
                            keep=cfg.get("keep"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0 and cfg.get("weights"):
        torch.save(full, cfg["weights"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
