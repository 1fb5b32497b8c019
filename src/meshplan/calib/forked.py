"""Run independent fits in forked worker processes (the per-record fits, the held-out folds).

Forked, not spawned: the rows (frozen dataclasses holding read-only mappings) reach the child
with its memory and are never pickled; only each result comes back, through a pipe, so it must be
plain data (``FitResult.settings`` travels as a dict). Falls back to one process where fork is
not available (Windows, macOS' default) or ``workers`` is 1.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from meshplan.errors import MeshplanError

T = TypeVar("T")


def _child(fn: Callable[[Any], Any], item: Any, conn) -> None:
    try:
        conn.send((True, fn(item)))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send((False, f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def map_forked(fn: Callable[[Any], T], items: Sequence[Any], workers: int) -> list[T]:
    """``[fn(x) for x in items]``, at most ``workers`` at a time in forked processes."""
    if workers < 1:
        raise MeshplanError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(items) < 2 or "fork" not in mp.get_all_start_methods():
        return [fn(x) for x in items]
    ctx = mp.get_context("fork")
    results: list[Any] = [None] * len(items)
    pending = list(enumerate(items))
    running: list[tuple[int, Any, Any]] = []
    while pending or running:
        while pending and len(running) < workers:
            i, item = pending.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(fn, item, send), daemon=True)
            proc.start()
            send.close()
            running.append((i, proc, recv))
        ready = multiprocessing.connection.wait([r for _, _, r in running])
        for entry in [e for e in running if e[2] in ready]:
            i, proc, recv = entry
            try:
                ok, value = recv.recv()
            except EOFError:
                ok, value = False, f"worker exited with code {proc.exitcode}"
            proc.join()
            running.remove(entry)
            if not ok:
                for _, p, _ in running:
                    p.terminate()
                raise MeshplanError(f"fit worker failed: {value}")
            results[i] = value
    return results
