"""Options and helpers shared by several commands (model, cluster, training, output)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import ClusterSpec, resolve_cluster
from meshplan.spec.model import ModelSpec, parse_overrides
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Optimizer, Precision, Recipe, TrainingSpec

def path_value(value: str) -> Path:
    """Parser of every path option and argument: typer would read an empty string as ``Path('')``,
    the current folder, and the user would be told that '.' is a directory."""
    if value == "":
        raise typer.BadParameter("an empty path")
    return Path(value)


ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Preset name (see `meshplan models`) or a Hugging Face config.json path (with a Job file: default the file's).")]
OverrideOpt = Annotated[Optional[str], typer.Option("--override", help="Change model fields, e.g. num_layers=2,hidden_size=64.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="System preset (dgx-h100, ...), or a YAML/JSON cluster file (`meshplan clusters --example`).")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", help="A bare GPU type instead of --cluster (h100-sxm, a100-80gb, ...).")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", "-n", help="Number of nodes.")]
GpusPerNodeOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the preset's).")]
SeqLenOpt = Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length in tokens (default: 2048, or the Job file's).")]
GlobalBatchOpt = Annotated[Optional[int], typer.Option("--global-batch", "-b", help="Global batch in sequences.")]
GlobalBatchTokensOpt = Annotated[Optional[int], typer.Option("--global-batch-tokens", help="Global batch in tokens (instead of --global-batch).")]
PrecisionOpt = Annotated[Optional[Precision], typer.Option("--precision", help="Matmul precision; fp8 and fp4 are the GEMM inputs, see --recipe (default: bf16, or the Job file's; `plan`: what the GPU supports, bf16, fp16 or fp32).")]
RecipeOpt = Annotated[Optional[Recipe], typer.Option("--recipe", help="Scaling recipe of fp8 (delayed, the default; tensorwise, rowwise, blockwise, mxfp8) or fp4 (nvfp4, the default; mxfp4) GEMMs.")]
OptimizerOpt = Annotated[Optional[Optimizer], typer.Option("--optimizer", help="Optimizer, its states set the memory (default: adamw, or the Job file's).")]
MemoryGibOpt = Annotated[Optional[float], typer.Option("--memory-gib", help="Memory budget per GPU in GiB, the device total a plan may reach (default: the GPU's memory).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
ClusterProfileOpt = Annotated[Optional[str], typer.Option("--cluster-profile", help="Hardware profile JSON from `meshplan profile` to replace preset figures.")]


PIPE_WIDTH_COLUMNS = 10_000
"""Width of the page when the output is not a terminal (a pipe, a file): wide enough that no table
is squeezed, so ``meshplan models | grep llama3-70b`` finds whole rows. Rich pads a table to its
own width, not to the page's, so a wide page adds no blanks."""


class UncutConsole(Console):
    """A console whose tables never cut a value: on a narrow terminal a cell folds onto more lines
    instead of ending in an ellipsis (rich's default ``overflow``)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's own name
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    column.overflow = "fold"
        super().print(*objects, **kwargs)


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH_COLUMNS
    return UncutConsole(stderr=stderr, highlight=False, width=width)


def console() -> Console:
    """Where tables go: the terminal's width on a terminal, full width in a pipe or a file."""
    return _console(stderr=False)


def err_console() -> Console:
    """Messages and progress on stderr, with the same rule as :func:`console`."""
    return _console(stderr=True)


def load_model(model: str, override: str | None) -> ModelSpec:
    return resolve_model(model, parse_overrides(override))


def load_cluster(
    cluster: str | None,
    gpu: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    gpus: int | None = None,
) -> ClusterSpec:
    """The cluster as named; a ``--cluster-profile`` goes through ``calib.hardware.resolve_hardware``."""
    return resolve_cluster(cluster, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node, gpus=gpus)


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
    if isinstance(o, Mapping):  # a read-only MappingProxyType (a fit's settings)
        return dict(o)
    if hasattr(o, "value"):
        return o.value
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
