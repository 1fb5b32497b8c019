"""`meshplan export-weights`: a training checkpoint -> a Hugging Face model directory (torch in the library only)."""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import JsonOpt, console, print_json, path_value
from meshplan.cli.main import app
from meshplan.errors import MeshplanError

BYTES_PER_GB = 10**9
"""--max-shard-gb counts decimal gigabytes, as transformers' max_shard_size does."""


class WeightsFormat(str, enum.Enum):
    HF = "hf"


@app.command("export-weights")
def export_weights(
    ckpt_dir: Annotated[Path, typer.Argument(parser=path_value, help="A checkpoint (step-NNNNNN) or a --checkpoint-dir root (its latest).")],
    out_dir: Annotated[Path, typer.Argument(parser=path_value, help="Directory to write (must be new or empty).")],
    to: Annotated[WeightsFormat, typer.Option("--to", help="Output format: hf (config.json + safetensors shards).")] = WeightsFormat.HF,
    family: Annotated[Optional[str], typer.Option("--family", help="Hugging Face model_type to write (llama, mistral, qwen2, qwen3, mixtral, gpt2); default: inferred from the model.")] = None,
    max_shard_gb: Annotated[float, typer.Option("--max-shard-gb", help="Largest safetensors shard, in GB.")] = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """Write a checkpoint's weights as a Hugging Face model directory that `transformers` loads."""
    if not max_shard_gb > 0:
        raise MeshplanError(f"--max-shard-gb must be positive, got {max_shard_gb}")
    shard_bytes = max_shard_gb * BYTES_PER_GB
    if not 1 <= shard_bytes < math.inf:  # 1e-12 GB rounds to 0 bytes, 1e300 GB overflows
        raise MeshplanError(f"--max-shard-gb {max_shard_gb:g} is not a shard size (at least one byte, finite)")
    from meshplan.runtime.hf_export import export_hf

    done = export_hf(ckpt_dir, out_dir, family=family, max_shard_bytes=int(shard_bytes))
    if json_out:
        print_json(done)
        return
    t = Table(title=f"meshplan export-weights: {done['checkpoint']} (step {done['step']})")
    for col in ("format", "family", "tensors", "shards", "MB", "written to"):
        t.add_column(col, justify="right")
    t.add_row(to.value, done["family"], str(done["tensors"]), str(done["shards"]),
              f"{done['bytes'] / 1e6:,.1f}", done["out"])
    console().print(t)
