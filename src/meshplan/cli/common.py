"""Options and helpers shared by several commands (model, cluster, training, output)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import ClusterSpec, resolve_cluster
from meshplan.spec.model import ModelSpec, parse_overrides
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Optimizer, Precision, Recipe, TrainingSpec

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Preset name (see `meshplan models`) or a Hugging Face config.json path.")]
OverrideOpt = Annotated[Optional[str], typer.Option("--override", help="Change model fields, e.g. num_layers=2,hidden_size=64.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="System preset (dgx-h100, ...), or a YAML/JSON cluster file.")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", help="A bare GPU type instead of --cluster (h100-sxm, a100-80gb, ...).")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", "-n", help="Number of nodes.")]
GpusPerNodeOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the preset's).")]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", "-s", help="Sequence length in tokens.")]
GlobalBatchOpt = Annotated[Optional[int], typer.Option("--global-batch", "-b", help="Global batch in sequences.")]
GlobalBatchTokensOpt = Annotated[Optional[int], typer.Option("--global-batch-tokens", help="Global batch in tokens (instead of --global-batch).")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="Matmul precision (fp8 and fp4: GEMM inputs; see --recipe).")]
RecipeOpt = Annotated[Optional[Recipe], typer.Option("--recipe", help="Scaling recipe of fp8 (delayed [default], tensorwise, rowwise, blockwise, mxfp8) or fp4 (nvfp4 [default], mxfp4) GEMMs.")]
OptimizerOpt = Annotated[Optimizer, typer.Option("--optimizer", help="Optimizer (its states set the memory).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
ClusterProfileOpt = Annotated[Optional[str], typer.Option("--cluster-profile", help="Hardware profile JSON from `meshplan profile` to replace preset figures.")]


def console() -> Console:
    return Console(highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def load_model(model: str, override: str | None) -> ModelSpec:
    return resolve_model(model, parse_overrides(override))


def load_cluster(
    cluster: str | None,
    gpu: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    gpus: int | None = None,
    profile: str | None = None,
) -> ClusterSpec:
    spec = resolve_cluster(cluster, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node, gpus=gpus)
    if profile:
        from meshplan.spec.hwprofile import apply_profile

        spec = apply_profile(spec, profile)
    return spec


def make_training(
    seq_len: int,
    global_batch: int | None,
    global_batch_tokens: int | None,
    precision: Precision,
    optimizer: Optimizer,
    recipe: Recipe | None = None,
) -> TrainingSpec:
    if (global_batch is None) == (global_batch_tokens is None):
        raise MeshplanError("give exactly one of --global-batch (sequences) or --global-batch-tokens")
    if global_batch_tokens is not None:
        return TrainingSpec.from_tokens(seq_len=seq_len, global_batch_tokens=global_batch_tokens,
                                        precision=precision, optimizer=optimizer, recipe=recipe)
    return TrainingSpec(seq_len=seq_len, global_batch=global_batch, precision=precision, optimizer=optimizer,
                        recipe=recipe)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "value"):
        return o.value
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
