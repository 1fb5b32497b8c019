"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP), and resume under any plan.

Save (every rank calls :func:`save_checkpoint`):
  1. rank 0 clears a stale staging directory ``step-NNNNNN.tmp``; barrier;
  2. every rank writes its own shards with ``dcp.save`` (one writer per rank) and its RNG state;
  3. barrier: from here on every shard is on disk;
  4. rank 0 writes ``meshplan_checkpoint.json`` (the Job, step, data position and every file's size)
     and renames the staging directory to ``step-NNNNNN``, then drops checkpoints beyond ``keep``;
  5. barrier, so no rank runs ahead of the commit.
A kill anywhere before the rename leaves only a ``.tmp`` directory, which loaders never read, so the
previous complete checkpoint stays the latest one.

Resharding: the state dict is built with ``get_state_dict`` (torch.distributed.checkpoint.state_dict),
which names every tensor by its *unsharded* fully-qualified name (wrapper prefixes removed; the
model's ``layers`` ModuleDict keeps global layer indices on every pipeline stage) and keeps tensors
as DTensors. DCP stores each DTensor's global shape and which chunk each rank wrote, so loading into
a model parallelised under another plan (FSDP -> TP, 4 ranks -> 2) reads exactly the chunks each new
rank needs. Optimizer state is flattened (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``) so it
too is keyed by FQN and merges across the model parts of a pipeline rank.

Load (:func:`load_checkpoint`) validates the metadata, the model and every file's size on every rank
before any tensor is read, so a bad checkpoint raises MeshplanError with nothing loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from meshplan import ckpt_meta
from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.errors import MeshplanError
from meshplan.plan import Job

log = logging.getLogger(__name__)

# Test-only fault injection, "RANK:STEP": that rank sleeps inside the save of that step, after
# writing its shards and before the commit barrier, and writes its pid to
# <staging>/sleeping-rank<RANK>.pid first, so a test can SIGKILL it at exactly that point.
SLEEP_IN_SAVE_ENV = "MESHPLAN_TEST_SLEEP_IN_SAVE"

# Test-only fault injection, "RANK:STEP": that rank SIGKILLs itself in the middle of that step
# (after forward and backward, before the optimizer step); see kill_for_test.
KILL_IN_STEP_ENV = "MESHPLAN_TEST_KILL_IN_STEP"

# Test-only, "RANK:STEP:PIDFILE": that rank writes its pid to PIDFILE in the middle of that step
# and waits there until a stop is requested (or PAUSE_MAX_S), so a test can signal the launcher or
# SIGKILL a rank at exactly that point; see pause_for_test.
PAUSE_IN_STEP_ENV = "MESHPLAN_TEST_PAUSE_IN_STEP"
PAUSE_MAX_S = 600.0
PAUSE_POLL_S = 0.05

# A tied LM head saved without pipeline parallel lives under the embedding's name only.
TIED_HEAD = ("output.weight", "tok_embeddings.weight")

_MODEL_OPTS = StateDictOptions(strict=False)  # strict=False: a pipeline part holds some keys only
_OPTIM_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


@dataclass(frozen=True, kw_only=True)
class TrainState:
    """Where training stands: what a resumed run needs besides the tensors."""

    step: int
    """Optimizer steps completed."""
    data_position: int
    """Sequences of the global data order consumed."""
    data_seed: int
    """Seed of the global data order."""


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _state_dict(model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> dict:
    """``{"model": {fqn: tensor}, "optim": {"state.<fqn>.<k>": ...}}`` over all parts of this rank."""
    model_sd: dict = {}
    optim_sd: dict = {}
    for part, opt in zip(model_parts, optimizers, strict=True):
        model_sd.update(get_model_state_dict(part, options=_MODEL_OPTS))
        optim_sd.update(get_optimizer_state_dict(part, opt, options=_OPTIM_OPTS))
    return {"model": model_sd, "optim": optim_sd}


def should_save(step: int, every: int | None, last_step: int) -> bool:
    """Save every ``every`` steps (none when 0 or None) and always after the last step."""
    return step == last_step or (bool(every) and step % every == 0)


def save_checkpoint(
    root: str | Path,
    *,
    state: TrainState,
    job: Job,
    model_parts: nn.Module | Sequence[nn.Module],
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    keep: int | None = None,
) -> Path:
    """Write ``root/step-NNNNNN`` from every rank; returns its path once committed.

    ``keep``: how many complete checkpoints to keep (None keeps all).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(root)
    name = ckpt_meta.step_dirname(state.step)
    staging, final = root / (name + ckpt_meta.STAGING_SUFFIX), root / name
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if staging.exists():  # left by a save that was killed
            shutil.rmtree(staging)
        staging.mkdir()
    dist.barrier()

    t0 = time.perf_counter()
    sd = _state_dict(_as_list(model_parts), _as_list(optimizers))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(staging, sync_files=True))
    _write_rng(staging / ckpt_meta.rng_filename(rank))
    _maybe_sleep_for_test(staging, rank, state.step)
    dist.barrier()  # every rank's shards are on disk

    if rank == 0:
        files = tuple(
            CheckpointFile(name=p.name, size_bytes=p.stat().st_size)
            for p in sorted(staging.iterdir()) if p.is_file()
        )
        meta = CheckpointMeta(step=state.step, data_position=state.data_position,
                              data_seed=state.data_seed, world_size=world, job=job, files=files)
        _commit(staging, final, meta)
        if keep:
            _prune(root, keep)
        log.info("checkpoint %s saved in %.2f s", final, time.perf_counter() - t0)
    dist.barrier()  # nobody moves on before the commit
    return final


def load_checkpoint(
    path: str | Path,
    *,
    job: Job,
    model_parts: nn.Module | Sequence[nn.Module],
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
) -> TrainState:
    """Load a checkpoint (or the latest one under a root) into models parallelised under ``job``.

    Every check runs before any tensor is touched: metadata, same model, every file present with
    its committed size. Under the same plan and world size each rank's RNG state is restored too
    (under another layout RNG streams do not map rank to rank, so they are left as seeded).
    """
    ckpt, meta = ckpt_meta.load_meta(path)
    ckpt_meta.check_same_model(ckpt, meta.job.model, job.model)
    rank, world = dist.get_rank(), dist.get_world_size()
    same_layout = meta.world_size == world and meta.job.plan == job.plan
    parts, opts = _as_list(model_parts), _as_list(optimizers)
    sd = _state_dict(parts, opts)
    aliases = (TIED_HEAD,) if job.model.tied_embeddings else ()
    try:
        _load_with_aliases(sd, ckpt, aliases)
    except Exception as exc:  # DCP wraps per-rank failures; make it one line naming the checkpoint
        raise MeshplanError(f"{ckpt}: could not load ({_first_line(exc)})") from None
    for part, opt in zip(parts, opts, strict=True):
        set_model_state_dict(part, sd["model"], options=_MODEL_OPTS)
        set_optimizer_state_dict(part, opt, sd["optim"], options=_OPTIM_OPTS)
    if same_layout:
        _read_rng(ckpt / ckpt_meta.rng_filename(rank))
    elif rank == 0:
        log.info("resuming %s under a new plan (%s on %d ranks, was %s on %d)", ckpt,
                 job.plan.notation(), world, meta.job.plan.notation(), meta.world_size)
    return TrainState(step=meta.step, data_position=meta.data_position, data_seed=meta.data_seed)


def _load_with_aliases(sd: dict, ckpt: Path, aliases: Sequence[tuple[str, str]]) -> None:
    """``dcp.load`` into ``sd``, reading a key the checkpoint lacks from its alias.

    A tied LM head is one parameter without pipeline parallel, saved (with its optimizer state)
    under ``tok_embeddings.weight``; under pp the last stage holds a copy named ``output.weight``
    whose Adam moments must come from the embedding's. Non-tensor values (param_groups: lr, betas)
    are replaced by DCP in ``request`` rather than filled in place, so they are copied back.
    """
    reader = dcp.FileSystemReader(ckpt)
    available = set(reader.read_metadata().state_dict_metadata)
    request = {group: dict(entries) for group, entries in sd.items()}
    moved: list[tuple[str, str, str]] = []  # (group, key this rank needs, key read instead)
    for group, entries in sd.items():
        for key in entries:
            if f"{group}.{key}" in available:
                continue
            for copy, owner in aliases:
                alt = re.sub(rf"(^|\.){re.escape(copy)}(\.|$)", rf"\g<1>{owner}\g<2>", key)
                if alt != key and f"{group}.{alt}" in available:
                    value = request[group].pop(key)
                    request[group].setdefault(alt, value)  # this rank may hold the owner too
                    moved.append((group, key, alt))
                    break
    dcp.load(request, storage_reader=reader)
    for group, entries in sd.items():  # tensors were filled in place; other values were replaced
        for key in entries:
            if key in request[group] and not isinstance(entries[key], torch.Tensor):
                entries[key] = request[group][key]
    for group, key, alt in moved:
        got, mine = request[group][alt], sd[group][key]
        if isinstance(mine, torch.Tensor) and got is not mine:
            mine.copy_(got)
        elif not isinstance(mine, torch.Tensor):
            sd[group][key] = got


def _commit(staging: Path, final: Path, meta: CheckpointMeta) -> None:
    """Metadata file last, then one atomic rename of the directory (rank 0 only)."""
    tmp = staging / (ckpt_meta.META_FILENAME + ".part")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(meta.to_dict(), indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, staging / ckpt_meta.META_FILENAME)
    if final.exists():  # re-saving a step after resuming from an older checkpoint
        old = final.with_name(final.name + ".old")
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old)
    else:
        os.replace(staging, final)
    _fsync_dir(final.parent)


def _prune(root: Path, keep: int) -> None:
    """Drop all but the newest ``keep`` complete checkpoints, and staging dirs older than them."""
    complete = ckpt_meta.complete_checkpoints(root)
    for _, p in complete[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    newest = complete[-1][0] if complete else 0
    for p in root.glob("step-*" + ckpt_meta.STAGING_SUFFIX):
        try:
            step = int(p.name[len("step-"):-len(ckpt_meta.STAGING_SUFFIX)])
        except ValueError:
            continue
        if step < newest:
            shutil.rmtree(p, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_rng(path: Path) -> None:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    with open(path, "wb") as fh:
        torch.save(states, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _read_rng(path: Path) -> None:
    states = torch.load(path, weights_only=True)
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _maybe_sleep_for_test(staging: Path, rank: int, step: int) -> None:
    if os.environ.get(SLEEP_IN_SAVE_ENV) != f"{rank}:{step}":
        return
    (staging / f"sleeping-rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def kill_for_test(rank: int, step: int) -> None:
    """SIGKILL this process when ``MESHPLAN_TEST_KILL_IN_STEP`` is ``rank:step`` (fault tests)."""
    if os.environ.get(KILL_IN_STEP_ENV) == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def pause_for_test(rank: int, step: int, stop_requested: Callable[[], object]) -> None:
    """Wait in the middle of a step when ``MESHPLAN_TEST_PAUSE_IN_STEP`` is ``rank:step:pidfile``."""
    spec = os.environ.get(PAUSE_IN_STEP_ENV, "").split(":", 2)
    if len(spec) != 3 or spec[:2] != [str(rank), str(step)]:
        return
    Path(spec[2]).write_text(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_MAX_S
    while not stop_requested() and time.monotonic() < deadline:
        time.sleep(PAUSE_POLL_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
