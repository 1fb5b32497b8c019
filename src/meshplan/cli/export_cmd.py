"""`meshplan export plan.json --to megatron|torchtitan|deepspeed`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from meshplan.cli.common import JsonOpt, err_console, print_json
from meshplan.cli.main import app
from meshplan.export.common import ExportTarget, export_job
from meshplan.plan import Job

log = logging.getLogger(__name__)


@app.command("export")
def export(
    plan_file: Annotated[Path, typer.Argument(help="A Job file from `meshplan plan --out` or `meshplan import`.")],
    to: Annotated[ExportTarget, typer.Option("--to", help="Target framework.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the config here instead of stdout.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write a plan as Megatron-LM arguments, a torchtitan TOML or a DeepSpeed JSON."""
    job = Job.load(plan_file)
    result = export_job(job, to)
    if out is not None:
        out.write_text(result.text)
    if json_out:
        print_json({"target": result.target.value, "text": result.text, "warnings": list(result.warnings),
                    "out": str(out) if out else None})
        return
    for w in result.warnings:
        err_console().print(f"[yellow]warning:[/yellow] {w}")
    if out is None:
        sys.stdout.write(result.text)
    else:
        err_console().print(f"wrote {result.target.value} config to {out}")
