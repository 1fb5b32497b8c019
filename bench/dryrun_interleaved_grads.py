"""How many virtual stages' unsharded FSDP gradients a rank holds at once under torch's interleaved
1F1B: torch's own code on CPU says (issue 14, memory; cost/memory.py accumulated_grad_params).

    PYTHONPATH=src python bench/dryrun_interleaved_grads.py [--microbatches 2 3 4]

Four CPU processes (gloo): pp 2 x FSDP 2, two virtual stages a rank (4 stages of two 256 x 256
linears, each linear and each stage ``fully_shard``-ed with ``reshard_after_forward=False``, as
torchtitan wraps its blocks under pipelining), stepped once by torch's
``ScheduleInterleaved1F1B``. After every backward of a stage the script reads, for each of the
rank's stages, the bytes of unsharded gradient its FSDP parameters hold (the accumulated
``unsharded_accumulated_grad``, else the unsharded parameter's ``.grad``) and prints the most
stages holding some at once. The cost model's rule: one with m <= p micro-batches (each stage's
backwards one group), all of them beyond.

Measured 2026-11-25 (torch 2.13 CPU): m = 2 (= p): 1 stage on both ranks; m = 3: 1 (torch runs
one round of m < 2p micro-batches; the model, which follows Megatron's groups of p, counts 2
there: an over-count); m = 4 (2p): 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

PP, VPP, WIDTH, TOKENS = 2, 2, 256, 8


def _held_bytes(module) -> int:
    """Unsharded gradient bytes the FSDP parameter groups inside ``module`` hold now."""
    from torch.distributed.fsdp import FSDPModule

    total = 0
    for sub in module.modules():
        if not isinstance(sub, FSDPModule):
            continue
        group = sub._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group is not None else ():
            grad = getattr(fp, "unsharded_accumulated_grad", None)
            unsharded = getattr(fp, "_unsharded_param", None)
            if grad is None and unsharded is not None:
                grad = unsharded.grad
            total += 0 if grad is None else grad.numel() * grad.element_size()
    return total


def _worker(rank: int, world: int, port: int, microbatches: int, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (PP, world // PP), mesh_dim_names=("pp", "dp"))
    pp_rank = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    modules, stages = [], []
    for j in range(VPP):
        part = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(2)))
        for block in part:
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=False)
        fully_shard(part, mesh=mesh["dp"], reshard_after_forward=False)
        modules.append(part)
        stages.append(PipelineStage(part, j * PP + pp_rank, PP * VPP, torch.device("cpu"),
                                    group=mesh["pp"].get_group()))
    most = 0
    for stage in stages:
        run = stage.backward_one_chunk

        def traced(*args, _run=run, **kwargs):
            nonlocal most
            out = _run(*args, **kwargs)
            most = max(most, sum(1 for m in modules if _held_bytes(m)))
            return out

        stage.backward_one_chunk = traced
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches,
                                       loss_fn=lambda y, target: (y.float() - target).pow(2).mean())
    if pp_rank == 0:
        schedule.step(torch.randn(microbatches, TOKENS, WIDTH))
    else:
        schedule.step(target=torch.zeros(microbatches, TOKENS, WIDTH))
    if mesh["dp"].get_local_rank() == 0:
        queue.put((pp_rank, most))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def held_stages(microbatches: int) -> dict[int, int]:
    """Most virtual stages holding unsharded gradients at once, per pipeline rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(2 * PP, _free_port(), microbatches, queue), nprocs=2 * PP,
                       start_method="spawn")
    out = {}
    while not queue.empty():
        rank, most = queue.get()
        out[rank] = most
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[2, 3, 4])
    args = ap.parse_args(argv)
    for m in args.microbatches:
        model = 1 if m <= PP else VPP
        print(f"m={m} (p={PP}, v={VPP}): torch holds {held_stages(m)} stages at once per pp rank; model {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
