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
from meshplan.runtime.microbatch import loss_context


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


def make_optimizer(cfg: dict, params: list) -> torch.optim.Optimizer:
    """SGD by default: weights then differ exactly as much as gradients do. Adam normalises
    noise-level gradients (e.g. of key biases, whose true gradient is 0) into lr-sized steps."""
    if cfg.get("optim", "sgd") == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"])
    return torch.optim.SGD(params, lr=cfg["lr"])


def batches(cfg: dict, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        seq = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"] + 1), generator=g)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def reference(cfg: dict, models, data, n_mb: int):
    """Whole model in this process; the batch in ``n_mb`` accumulated micro-batches."""
    model = models.build("cpu")
    models.init(model)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = make_optimizer(cfg, list(model.parameters()))
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


class ToyModels:
    """The toy model above with the toy parallelize: pipeline mechanics on their own."""

    def __init__(self, cfg: dict, plan: Plan) -> None:
        self.cfg, self.plan = cfg, plan
        names = tuple(a.value for a in MESH_AXIS_ORDER)
        self.mesh = init_device_mesh("cpu", plan.dims.mesh_shape, mesh_dim_names=names)

    def build(self, device: str) -> nn.Module:
        c = self.cfg
        with torch.device(device):
            return ToyTransformer(c["vocab"], c["dim"], c["layers"], c["seq_len"], c["tied"])

    def init(self, module: nn.Module) -> None:
        if any(p.is_meta for p in module.parameters()):
            module.to_empty(device="cpu")
        init_by_name(module, self.cfg["seed"])

    def parallelize(self, module: nn.Module) -> nn.Module:
        return toy_parallelize(module, self.plan, self.mesh)


class RuntimeModels:
    """meshplan's reference Transformer (a preset shrunk by overrides) and the runtime's parallelize."""

    def __init__(self, cfg: dict, plan: Plan) -> None:
        from meshplan.runtime.mesh import build_ep_mesh, build_mesh
        from meshplan.spec.presets import resolve_model

        self.cfg, self.plan = cfg, plan
        self.spec = resolve_model(cfg["model"], cfg.get("override", {}))
        self.mesh = build_mesh(plan, "cpu")
        self.ep_mesh = build_ep_mesh(plan, "cpu")
        cfg.update(vocab=self.spec.vocab_size)

    def build(self, device: str) -> nn.Module:
        from meshplan.runtime.models import build_model

        return build_model(self.spec, device)

    def init(self, module: nn.Module) -> None:
        module.init_weights(self.cfg["seed"])

    def parallelize(self, module: nn.Module) -> nn.Module:
        from meshplan.runtime.parallelize import parallelize

        return parallelize(module, self.plan, self.mesh, ep_mesh=self.ep_mesh)


def _local_view(module_name: str, module: nn.Module, short: str, p: torch.Tensor, ref: torch.Tensor):
    """(this rank's values, the reference's values of the same slice) for one parameter."""
    full = _full(p.detach())
    ep_size = getattr(module, "ep_size", 1)
    if ep_size > 1:  # expert-parallel slice of the expert dim (plain tensor)
        n = full.shape[0]
        ref = ref[module.ep_rank * n:(module.ep_rank + 1) * n]
    return full, ref


def run_config(cfg: dict) -> dict:
    plan = Plan.from_dict(cfg["plan"])
    dims: ParallelDims = plan.dims
    models = RuntimeModels(cfg, plan) if cfg.get("model") else ToyModels(cfg, plan)
    mesh = models.mesh
    dp = dims.dp
    dp_rank = mesh["dp_replicate"].get_local_rank() * dims.dp_shard + mesh["dp_shard"].get_local_rank()
    cp_rank = mesh["cp"].get_local_rank()
    n_mb = cfg["batch"] // (dp * plan.micro_batch)
    data = batches(cfg, cfg["steps"])
    ref_losses, ref_norms, ref_state, init_state = reference(cfg, models, data, n_mb * dp)

    meta = models.build("meta")
    pipe = build_pipeline(
        meta, plan, mesh, loss_fn=loss_fn, device=torch.device("cpu"),
        parallelize_stage=models.parallelize, init_stage=models.init,
        n_microbatches=None if cfg.get("lazy_n_mb") else n_mb,
    )
    opt = make_optimizer(cfg, list(pipe.parameters()))
    losses, norms = [], []
    for tokens, targets in data:
        opt.zero_grad()
        rows = slice(dp_rank * n_mb * plan.micro_batch, (dp_rank + 1) * n_mb * plan.micro_batch)
        s_cp = cfg["seq_len"] // dims.cp  # context parallel: contiguous sequence chunks
        cols = slice(cp_rank * s_cp, (cp_rank + 1) * s_cp)
        with loss_context(plan):  # runtime models under tp: vocab-sharded logits (loss_parallel)
            loss = pipe.step(tokens[rows, cols].contiguous(), targets[rows, cols].contiguous())
        if cfg.get("clip"):
            norms.append(pipe.clip_grad_norm_(cfg["clip"]).item())
        opt.step()
        losses.append(None if loss is None else loss.item())
    max_diff = moved = 0.0
    worst = ""
    for stage in pipe.stage_modules:
        for mod_name, module in stage.named_modules():
            for short, p in module.named_parameters(recurse=False):
                name = f"{mod_name}.{short}".replace("._checkpoint_wrapped_module", "").replace("_checkpoint_wrapped_module.", "")
                got, ref = _local_view(mod_name, module, short, p, ref_state[name])
                _, init = _local_view(mod_name, module, short, p, init_state[name])
                if (got - ref).abs().max().item() > max_diff:
                    worst = name
                max_diff = max(max_diff, (got - ref).abs().max().item())
                moved = max(moved, (got - init).abs().max().item())
    gathered = [None] * dist.get_world_size()
    names = sorted(n.replace("._checkpoint_wrapped_module", "") for n, _ in pipe.named_parameters())
    dist.all_gather_object(gathered, {"losses": losses, "max_weight_diff": max_diff, "moved": moved, "worst": worst,
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
        "worst_param": max(gathered, key=lambda g: g["max_weight_diff"])["worst"],
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
