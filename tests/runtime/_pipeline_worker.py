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
from torch.distributed.tensor import DTensor, distribute_tensor

from meshplan.plan import MESH_AXIS_ORDER, ParallelDims, Plan, Recompute
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
            name = name.replace("._checkpoint_wrapped_module", "")
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.randn(p.shape, generator=g) * 0.2
            if isinstance(p, DTensor):
                full = distribute_tensor(full, p.device_mesh, p.placements)
            p.copy_(full)


def materialise(module: nn.Module, seed: int) -> None:
    module.to_empty(device="cpu")
    init_by_name(module, seed)


def toy_parallelize(module: nn.Module, plan: Plan, mesh) -> nn.Module:
    """A minimal stand-in for the runtime's parallelize: TP (Megatron MLP split), AC, FSDP2/replicate."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    d = plan.dims
    if d.tp > 1:
        for layer in module.layers.values():
            parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    if plan.recompute != Recompute.NONE:
        for key in list(module.layers.keys()):
            module.layers[key] = checkpoint_wrapper(module.layers[key])
    if d.dp_shard > 1:
        for layer in module.layers.values():
            fully_shard(layer, mesh=mesh["dp_shard"], reshard_after_forward=plan.zero == 3)
        fully_shard(module, mesh=mesh["dp_shard"], reshard_after_forward=plan.zero == 3)
    elif d.dp_replicate > 1:
        replicate(module, mesh=mesh["dp_replicate"])
    return module


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def batches(cfg: dict, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        seq = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"] + 1), generator=g)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def reference(cfg: dict, data, n_mb: int):
    """Whole model in this process; the batch in ``n_mb`` accumulated micro-batches."""
    model = ToyTransformer(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["seq_len"], cfg["tied"])
    init_by_name(model, cfg["seed"])
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    losses, norms = [], []
    for tokens, targets in data:
        opt.zero_grad()
        total = 0.0
        for t, y in zip(tokens.chunk(n_mb), targets.chunk(n_mb)):
            loss = loss_fn(model(t), y) / n_mb
            loss.backward()
            total += loss.item()
        if cfg.get("clip"):
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"]).item())
        opt.step()
        losses.append(total)
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}, init_state


def run_config(cfg: dict) -> dict:
    plan = Plan.from_dict(cfg["plan"])
    dims: ParallelDims = plan.dims
    names = tuple(a.value for a in MESH_AXIS_ORDER)
    mesh = init_device_mesh("cpu", dims.mesh_shape, mesh_dim_names=names)
    dp = dims.dp
    dp_rank = mesh["dp_replicate"].get_local_rank() * dims.dp_shard + mesh["dp_shard"].get_local_rank()
    n_mb = cfg["batch"] // (dp * plan.micro_batch)
    data = batches(cfg, cfg["steps"])
    ref_losses, ref_norms, ref_state, init_state = reference(cfg, data, n_mb * dp)

    with torch.device("meta"):
        meta = ToyTransformer(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["seq_len"], cfg["tied"])
    pipe = build_pipeline(
        meta, plan, mesh, loss_fn=loss_fn, device=torch.device("cpu"),
        parallelize_stage=lambda m: toy_parallelize(m, plan, mesh), init_stage=lambda m: materialise(m, cfg["seed"]),
        n_microbatches=None if cfg.get("lazy_n_mb") else n_mb,
    )
    opt = torch.optim.AdamW(list(pipe.parameters()), lr=cfg["lr"])
    losses, norms = [], []
    for tokens, targets in data:
        opt.zero_grad()
        share = slice(dp_rank * n_mb * plan.micro_batch, (dp_rank + 1) * n_mb * plan.micro_batch)
        loss = pipe.step(tokens[share], targets[share])
        if cfg.get("clip"):
            norms.append(pipe.clip_grad_norm_(cfg["clip"]).item())
        opt.step()
        losses.append(None if loss is None else loss.item())
    max_diff = moved = 0.0
    for name, p in pipe.named_parameters():
        name = name.replace("._checkpoint_wrapped_module", "")
        full = _full(p.detach())
        max_diff = max(max_diff, (full - ref_state[name]).abs().max().item())
        moved = max(moved, (full - init_state[name]).abs().max().item())
    gathered = [None] * dist.get_world_size()
    names = sorted(n.replace("._checkpoint_wrapped_module", "") for n, _ in pipe.named_parameters())
    dist.all_gather_object(gathered, {"losses": losses, "max_weight_diff": max_diff, "moved": moved,
                                       "names": names})
    last = [g["losses"] for g in gathered if g["losses"][0] is not None]
    # Each DP rank's loss is the mean over its share; equal shares, so the global mean is their
    # mean (TP ranks of one DP rank hold the same value: average over all last-stage ranks).
    pp_losses = [sum(col) / len(col) for col in zip(*last)]
    covered = sorted({n for g in gathered for n in g["names"]})
    return {
        "name": cfg["name"],
        "ref_losses": ref_losses,
        "ref_grad_norms": ref_norms,
        "pp_grad_norms": norms,
        "pp_losses": pp_losses,
        "max_weight_diff": max(g["max_weight_diff"] for g in gathered),
        "weights_moved": min(g["moved"] for g in gathered),
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
