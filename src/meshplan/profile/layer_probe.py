"""Run the layer probe (meshplan.calib.layer_probe) through the runtime over 2 CPU processes.

Each probe kind is the runtime's own path: ``build_mesh``, the reference model, ``parallelize``
(DTensor TP + SP, FSDP2, replicate, Ulysses or ring attention) and the training loss under
``loss_context``, forward + backward of one row, with 1 and with 5 layers. Times are the median
of three windows on the slowest rank.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from meshplan.profile.collectives import CPU_THREADS_PER_PROC, _free_port, spawn_and_collect
from meshplan.calib.hwprofile import LayerProbeSample
from meshplan.calib.layer_probe import PROBE_GROUP_SIZE, PROBE_LAYERS, ProbeKind, probe_job, probe_plan


def progress_steps() -> int:
    return len(ProbeKind)


def run_layer_probes(budget_s: float, on_progress: Callable[[str], None]) -> tuple[LayerProbeSample, ...]:
    """Every ProbeKind over PROBE_GROUP_SIZE CPU processes; ``budget_s`` per timing."""
    rows = spawn_and_collect(_worker, (budget_s, _free_port()), PROBE_GROUP_SIZE, on_progress, "layer probe")
    return tuple(LayerProbeSample(**r) for r in rows)


def _worker(rank: int, budget_s: float, port: int, q: Any) -> None:
    warnings.filterwarnings("ignore")  # torch's deprecation notices about mesh slicing
    torch.set_num_threads(CPU_THREADS_PER_PROC)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(PROBE_GROUP_SIZE))
    dist.init_process_group("gloo")
    try:
        rows = []
        for kind in ProbeKind:
            for layers in PROBE_LAYERS:
                t = torch.tensor([_time_probe(kind, layers, budget_s)], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
                rows.append(asdict(LayerProbeSample(kind=kind.value, group_size=PROBE_GROUP_SIZE, layers=layers,
                                                    time_s=float(t.item()))))
            if rank == 0:
                q.put(("progress", f"layer probe {kind.value}"))
        if rank == 0:
            q.put(("result", rows))
            time.sleep(0.2)  # let the queue's feeder thread flush before the process exits
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _time_probe(kind: ProbeKind, layers: int, budget_s: float) -> float:
    from meshplan.runtime.mesh import build_mesh
    from meshplan.runtime.models import build_model
    from meshplan.runtime.parallelize import parallelize
    from meshplan.runtime.microbatch import loss_context, token_loss_sum
    from meshplan.spec.cluster import system_preset

    plan = probe_plan(kind)
    job = probe_job(plan, layers, system_preset("cpu"))
    plan = job.plan
    mesh = build_mesh(plan, "cpu")
    model = build_model(job.model, "meta")
    parallelize(model, plan, mesh)
    model.init_device = torch.device("cpu")
    model.init_weights(0)
    local_len = job.training.seq_len // plan.dims.cp
    gen = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, job.model.vocab_size, (1, local_len), generator=gen)
    targets = torch.randint(0, job.model.vocab_size, (1, local_len), generator=gen)

    def step() -> None:
        with loss_context(plan):
            loss = token_loss_sum(model(tokens), targets) / tokens.numel()
            loss.backward()

    for _ in range(3):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    step()
    first = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)  # every rank must run the same number of steps
    iters = max(2, min(50, int(budget_s / 3 / max(float(first.item()), 1e-6))))
    windows = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        windows.append((time.perf_counter() - t0) / iters)
    return sorted(windows)[1]
