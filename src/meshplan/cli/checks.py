"""Checks of CLI flags where they enter, shared by the commands: one line naming the flag.

Numbers go through ``meshplan.numbers`` (the same rule as a value read from a file); this module
adds what only the command line knows: which flags were typed, the GPU a memory budget is for,
and output paths that must be writable before long work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import typer

try:  # typer >= 0.17 vendors click as typer._click; older typer depends on click itself
    from typer import _click as click
except ImportError:  # pragma: no cover - depends on the installed typer
    import click

from meshplan.errors import MeshplanError
from meshplan.numbers import check_count, check_finite
from meshplan.spec.cluster import GPUSpec
from meshplan.textfile import check_writable


def typed_flags(ctx: typer.Context, names: Iterable[str]) -> list[str]:
    """The flags among ``names`` (parameter names) given on the command line, as typed
    (``--tp``), whatever their value: a flag set to its default is still a flag given."""
    by_name = {p.name: p for p in ctx.command.params}
    return [by_name[n].opts[0] for n in names
            if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]


def refuse_with(ctx: typer.Context, names: Iterable[str], *, because: str) -> None:
    """MeshplanError when any of the flags ``names`` was typed: ``because`` says which other
    flag makes them meaningless ("--plan brings its own model")."""
    given = typed_flags(ctx, names)
    if given:
        raise MeshplanError(f"{because}: drop {', '.join(given)}")


def needs(ctx: typer.Context, name: str, ok: bool, *, without: str) -> None:
    """A typed flag that has no effect unless another holds (``--schedule`` without ``--pp > 1``)
    is refused, not ignored."""
    given = typed_flags(ctx, [name])
    if given and not ok:
        raise MeshplanError(f"{given[0]} has no effect without {without}")


def memory_budget_gib(memory_gib: float | None, gpu: GPUSpec, flag: str = "--memory-gib") -> float | None:
    """A memory budget per GPU: finite, positive and no more than the GPU has (a budget above it
    would call a plan that cannot run "fitting")."""
    if memory_gib is None:
        return None
    check_finite(flag, memory_gib, positive=True)
    if memory_gib > gpu.memory_gib:
        raise MeshplanError(f"{flag} {memory_gib:g} is more than the {gpu.memory_gib:g} GiB of one "
                            f"{gpu.name} (the budget is per GPU)")
    return memory_gib


def positive_rate(flag: str, value: float) -> float:
    """A rate such as ``--lr``: finite and > 0."""
    return check_finite(flag, value, positive=True)


def count_flag(flag: str, value: int | None, *, minimum: int = 1) -> int | None:
    """An integer flag that counts something (``--steps``, ``--procs``): in [minimum, MAX_COUNT]."""
    return None if value is None else check_count(flag, value, minimum=minimum)


def output_path(path: Path | str | None, flag: str, what: str) -> None:
    """An output file flag (``--out``, ``--log``, ``--plot``) that can be written, checked before
    the work whose result it holds."""
    if path is not None:
        try:
            check_writable(path, what=what)
        except MeshplanError as exc:
            raise MeshplanError(f"{exc} ({flag})") from None


def nodes_and_gpus(nodes: int | None, counts: list[int] | None, gpus_text: str | None) -> None:
    """``--nodes`` with a list or range of ``--gpus`` has no single meaning: refuse it. (One
    count with ``--nodes`` is checked against nodes x GPUs per node by resolve_cluster.)"""
    if nodes is not None and counts is not None and len(counts) > 1:
        raise MeshplanError(f"give --nodes or a list/range of --gpus ({gpus_text}), not both")


def explain_gpu_range(text: str, counts: list[int], exc: MeshplanError) -> MeshplanError:
    """A failure on one count of a ``--gpus`` range, with what the range means."""
    if "-" not in text:
        return exc
    listed = ", ".join(map(str, counts))
    return MeshplanError(f"--gpus {text} means the doubling counts {listed} (a range lo-hi is lo, 2*lo, "
                         f"4*lo, ... up to hi; give a list like 8,16,64 for other counts): {exc}")
