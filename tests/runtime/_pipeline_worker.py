"""torchrun worker for the pipeline tests: each config runs PP and an in-process reference.

Launched as ``python -m torch.distributed.run --nproc-per-node N tests/runtime/_pipeline_worker.py
CONFIGS_JSON OUT_JSON``. For every config, every rank trains the whole model in one process (the
reference: plain forward/backward with gradient accumulation over the same micro-batches) and the
pipelined model, then rank 0 gathers the per-step losses and the max weight difference.
"""

from __future__ import annotations

import json
import sys
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from meshplan.plan import MESH_AXIS_ORDER, ParallelDims, Plan
from meshplan.runtime.pipeline import build_pipeline


class ToyBlock(nn.Module):
    """A pre-norm residual MLP block: enough structure to test the pipeline cut, no attention."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 2 * dim)
        self.w2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class ToyTransformer(nn.Module):
    """Same attribute contract as meshplan.runtime.models.Transformer (tok/pos embeddings, layers
    ModuleDict, norm, output), so the pipeline cut can be tested on its own."""

    def __init__(self, vocab: int, dim: int, n_layers: int, seq_len: int, tied: bool) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.pos_embeddings = nn.Embedding(seq_len, dim)
        self.layers = nn.ModuleDict({str(i): ToyBlock(dim) for i in range(n_layers)})
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_embeddings(x) + self.pos_embeddings(pos)  # (B, S, D)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)  # (B, S, V)
        return x


def init_by_name(module: nn.Module, seed: int) -> None:
    """Deterministic init keyed by FQN, so a stage gets the same values as the whole model."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def materialise(module: nn.Module, seed: int) -> None:
    module.to_empty(device="cpu")
    init_by_name(module, seed)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def batches(cfg: dict, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        seq = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"] + 1), generator=g)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def reference(cfg: dict, data, n_mb: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = ToyTransformer(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["seq_len"], cfg["tied"])
    init_by_name(model, cfg["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    losses = []
    for tokens, targets in data:
        opt.zero_grad()
        total = 0.0
        for t, y in zip(tokens.chunk(n_mb), targets.chunk(n_mb)):
            loss = loss_fn(model(t), y) / n_mb
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_config(cfg: dict) -> dict:
    plan = Plan.from_dict(cfg["plan"])
    dims: ParallelDims = plan.dims
    mesh = init_device_mesh("cpu", dims.mesh_shape, mesh_dim_names=tuple(a.value for a in MESH_AXIS_ORDER))
    n_mb = cfg["batch"] // plan.micro_batch
    data = batches(cfg, cfg["steps"])
    ref_losses, ref_state = reference(cfg, data, n_mb)

    with torch.device("meta"):
        meta = ToyTransformer(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["seq_len"], cfg["tied"])
    pipe = build_pipeline(
        meta, plan, mesh, loss_fn=loss_fn, device=torch.device("cpu"),
        parallelize_stage=lambda m: m, init_stage=lambda m: materialise(m, cfg["seed"]),
        n_microbatches=n_mb,
    )
    opt = torch.optim.AdamW(list(pipe.parameters()), lr=cfg["lr"])
    losses = []
    for tokens, targets in data:
        opt.zero_grad()
        loss = pipe.step(tokens, targets)
        opt.step()
        losses.append(None if loss is None else loss.item())
    max_diff = 0.0
    for name, p in pipe.named_parameters():
        max_diff = max(max_diff, (p.detach() - ref_state[name]).abs().max().item())
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"losses": losses, "max_weight_diff": max_diff,
                                       "names": sorted(n for n, _ in pipe.named_parameters())})
    last = [g["losses"] for g in gathered if g["losses"][0] is not None]
    covered = sorted({n for g in gathered for n in g["names"]})
    return {
        "name": cfg["name"],
        "ref_losses": ref_losses,
        "pp_losses": last[0],
        "max_weight_diff": max(g["max_weight_diff"] for g in gathered),
        "params_covered": covered == sorted(ref_state),
    }


def main() -> None:
    configs = json.loads(open(sys.argv[1]).read())
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    results = [run_config(cfg) for cfg in configs]
    if dist.get_rank() == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
