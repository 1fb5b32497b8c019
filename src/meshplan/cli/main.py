"""The ``meshplan`` console script: one typer app, one module per command.

Every MeshplanError, and every usage error typer finds (a missing option, a value that is not a
number), becomes one line on stderr and exit code 2 (never a traceback, never a panel).
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from meshplan import __version__
from meshplan.cli.checks import click
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
        code = app(standalone_mode=False)
    except MeshplanError as exc:
        code = getattr(exc, "exit_code", 2)  # a run stopped on SIGTERM: its own status, not an error
        if code != 2:
            sys.stderr.write(f"{exc}\n")
            sys.exit(code)
        _fail(str(exc), 2)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `meshplan`: the help, as typer prints it
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.ClickException as exc:  # typer's usage errors, on one line like ours
        _fail(_usage_message(exc), exc.exit_code)
    except typer.Abort:
        _fail("aborted", 1)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    sys.exit(code)


def _usage_message(exc: click.exceptions.ClickException) -> str:
    """typer's usage error as one sentence, with the command whose --help to read."""
    msg = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        msg += f" (see `{ctx.command_path} --help`)"
    return msg
