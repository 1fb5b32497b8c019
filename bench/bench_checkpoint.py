"""Checkpoint save/load time and size for one model and plan (prints figures; not a test).

    python -m torch.distributed.run --standalone --nproc-per-node 4 bench/bench_checkpoint.py \
        --model toy-llama --override num_layers=8,hidden_size=512,num_heads=8,vocab_size=8192 --dp-shard 4

Builds the runtime's model under an FSDP (zero 3) or TP plan, takes one optimizer step so AdamW
has its moments, then times ``save_checkpoint`` and ``load_checkpoint`` (rank 0 prints the slowest
rank's time, the checkpoint's size, and bytes per second).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.runtime.checkpoint import TrainState, load_checkpoint, save_checkpoint
from meshplan.runtime.mesh import build_mesh
from meshplan.runtime.models import build_model
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.optim import make_optimizer
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.model import parse_overrides
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="toy-llama")
    ap.add_argument("--override", default="num_layers=4,hidden_size=256,num_heads=8,vocab_size=4096")
    ap.add_argument("--dp-shard", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    dims = ParallelDims(dp_shard=args.dp_shard, tp=args.tp)
    model_spec = resolve_model(args.model, parse_overrides(args.override))
    training = TrainingSpec(seq_len=64, global_batch=dims.dp, precision=Precision.FP32)
    plan = Plan(dims=dims, zero=3 if dims.dp_shard > 1 else 0, micro_batch=1)
    job = Job(model=model_spec, training=training, cluster=resolve_cluster("cpu", gpus=dims.world_size), plan=plan)
    full = job.full_plan

    def fresh():
        model = build_model(model_spec, "meta")
        parallelize(model, full, build_mesh(full, "cpu"))
        model.init_device = torch.device("cpu")
        model.init_weights(0)
        opt = make_optimizer(job, list(model.parameters()), 1e-3)
        model(torch.zeros(1, 8, dtype=torch.long)).float().sum().backward()
        opt.step()
        return model, opt

    model, opt = fresh()
    root = Path(tempfile.mkdtemp(prefix="meshplan-bench-ckpt-")) if dist.get_rank() == 0 else None
    shared = [str(root) if root else None]
    dist.broadcast_object_list(shared, src=0)
    root = Path(shared[0])
    t0 = time.perf_counter()
    ckpt = save_checkpoint(root, state=TrainState(step=1, data_position=0, data_seed=0), job=job,
                           model_parts=model, optimizers=opt)
    save_s = slowest(time.perf_counter() - t0)
    model2, opt2 = fresh()
    t0 = time.perf_counter()
    load_checkpoint(root, job=job, model_parts=model2, optimizers=opt2)
    load_s = slowest(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        size = sum(p.stat().st_size for p in ckpt.iterdir())
        print(f"{model_spec.name} {model_spec.num_params() / 1e6:.1f}M params, {plan.notation()} on "
              f"{dims.world_size} CPU ranks: checkpoint {size / 2**20:.1f} MiB; save {save_s:.2f} s "
              f"({size / save_s / 2**20:.0f} MiB/s), load {load_s:.2f} s ({size / load_s / 2**20:.0f} MiB/s)")
        shutil.rmtree(root)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
