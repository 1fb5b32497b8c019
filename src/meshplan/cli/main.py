"""The ``meshplan`` console script: one typer app, one module per command.

Every MeshplanError becomes one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from meshplan import __version__
from meshplan.errors import MeshplanError

app = typer.Typer(
    name="meshplan",
    help="Find, estimate and run the best parallel plan for training a Transformer on many GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"meshplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug detail.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, console=Console(stderr=True))],  # stdout: tables, --json
        force=True,
    )


def _register() -> None:
    """Import the command modules; each adds itself to ``app``."""
    from meshplan.cli import commands  # noqa: F401


def main() -> None:
    _register()
    try:
        app()
    except MeshplanError as exc:
        code = getattr(exc, "exit_code", 2)  # a run stopped on SIGTERM: its own status, not an error
        sys.stderr.write(f"error: {exc}\n" if code == 2 else f"{exc}\n")
        sys.exit(code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
