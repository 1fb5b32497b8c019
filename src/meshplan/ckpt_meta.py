"""What a meshplan checkpoint holds besides its tensors, read and checked without torch.

A checkpoint root (``--checkpoint-dir``) holds one directory per saved step::

    ckpt/
      step-000004/                  complete: renamed into place only once every rank has written
        meshplan_checkpoint.json    this module's metadata (Job, step, data position, file list)
        .metadata                   torch.distributed.checkpoint's global index
        __0_0.distcp ...            one DCP shard file per writing rank
        rng-rank00000.pt ...        each rank's RNG state
      step-000006.tmp/              a save in progress (or interrupted): never read

The metadata file is written last, by rank 0, after a barrier, and then the staging directory is
renamed (an atomic ``rename(2)`` on one file system). So a directory named ``step-NNNNNN`` with a
metadata file is complete, and an interrupted save leaves only a ``.tmp`` directory behind.

Everything a loader needs to refuse a bad checkpoint *before* touching a tensor is here: the Job
the checkpoint was made with (model spec, training spec, plan), and the size of every file it wrote,
so a missing or truncated shard is named before any rank loads anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.jsonfile import load_json_file
from meshplan.plan import Job
from meshplan.spec.model import ModelSpec

CHECKPOINT_FORMAT_VERSION = 1
META_FILENAME = "meshplan_checkpoint.json"
DCP_INDEX_FILENAME = ".metadata"  # written by torch.distributed.checkpoint's FileSystemWriter
STAGING_SUFFIX = ".tmp"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_dirname(step: int) -> str:
    """``step-000100``: zero-padded so that a plain sort is step order."""
    return f"step-{step:06d}"


def rng_filename(rank: int) -> str:
    return f"rng-rank{rank:05d}.pt"


@dataclass(frozen=True, kw_only=True)
class CheckpointFile:
    """One file of a checkpoint, with the size it had when the checkpoint was committed."""

    name: str
    size_bytes: int


@dataclass(frozen=True, kw_only=True)
class CheckpointMeta:
    """The meshplan metadata of one complete checkpoint."""

    step: int
    """Optimizer steps completed when the checkpoint was taken."""
    data_position: int
    """Sequences of the global, deterministic data order consumed so far (step * global_batch
    unless the batch changed on a re-plan)."""
    data_seed: int
    """Seed of the global data order; a resumed run must read the same order."""
    world_size: int
    """Ranks that wrote the checkpoint (its RNG files are per rank)."""
    job: Job
    """Model, training and plan the checkpoint was made with."""
    files: tuple[CheckpointFile, ...]
    """Every file of the checkpoint except this metadata file."""
    version: int = CHECKPOINT_FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("step", "data_position", "world_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MeshplanError(f"{name} must be a non-negative integer, got {v!r}")
        if self.world_size != self.job.plan.dims.world_size:
            raise MeshplanError(
                f"world_size={self.world_size} disagrees with the plan's "
                f"{self.job.plan.dims.world_size} ranks"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "meshplan_checkpoint_version": self.version,
            "step": self.step,
            "data_position": self.data_position,
            "data_seed": self.data_seed,
            "world_size": self.world_size,
            "job": self.job.to_dict(),
            "files": [{"name": f.name, "size_bytes": f.size_bytes} for f in self.files],
        }

    @classmethod
    def from_dict(cls, data: Any) -> "CheckpointMeta":
        if not isinstance(data, dict) or "meshplan_checkpoint_version" not in data:
            raise MeshplanError("no 'meshplan_checkpoint_version' field")
        version = data["meshplan_checkpoint_version"]
        if version != CHECKPOINT_FORMAT_VERSION:
            raise MeshplanError(
                f"checkpoint format version {version!r} is not supported "
                f"(this meshplan reads {CHECKPOINT_FORMAT_VERSION})"
            )
        missing = [k for k in ("step", "data_position", "data_seed", "world_size", "job", "files")
                   if k not in data]
        if missing:
            raise MeshplanError(f"missing field(s): {', '.join(missing)}")
        try:
            files = tuple(CheckpointFile(name=str(f["name"]), size_bytes=int(f["size_bytes"]))
                          for f in data["files"])
        except (TypeError, KeyError, ValueError, OverflowError):
            raise MeshplanError("'files' must be a list of {name, size_bytes}") from None
        return cls(
            step=data["step"], data_position=data["data_position"], data_seed=data["data_seed"],
            world_size=data["world_size"], job=Job.from_dict(data["job"]), files=files,
            version=version,
        )


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every committed checkpoint under ``root``, oldest first.

    Staging (``.tmp``) directories and directories without a metadata file are skipped: they are
    interrupted saves.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and (child / META_FILENAME).is_file():
            out.append((int(m.group(1)), child))
    return sorted(out)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None when there is none."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or the latest complete one under a checkpoint root."""
    p = Path(path)
    if not p.exists():
        raise MeshplanError(f"{p}: no such checkpoint directory")
    if not p.is_dir():
        raise MeshplanError(f"{p}: not a directory (give a checkpoint directory)")
    if (p / META_FILENAME).is_file():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        staging = sorted(c.name for c in p.iterdir() if c.name.endswith(STAGING_SUFFIX))
        hint = f" (only interrupted saves: {', '.join(staging)})" if staging else ""
        raise MeshplanError(
            f"{p}: not a meshplan checkpoint (no {META_FILENAME} and no complete step-* "
            f"checkpoint inside){hint}"
        )
    return latest


def read_meta(ckpt: str | Path) -> CheckpointMeta:
    """Parse one checkpoint's metadata file; errors name the file."""
    return load_json_file(Path(ckpt) / META_FILENAME, CheckpointMeta.from_dict,
                          missing="missing (not a meshplan checkpoint)", what="checkpoint metadata (JSON)")


def verify_files(ckpt: str | Path, meta: CheckpointMeta) -> None:
    """Check that every file the checkpoint committed is there with its committed size."""
    ckpt = Path(ckpt)
    names = {f.name for f in meta.files}
    if DCP_INDEX_FILENAME not in names:
        raise MeshplanError(f"{ckpt / META_FILENAME}: lists no {DCP_INDEX_FILENAME} (DCP index) file")
    for f in meta.files:
        path = ckpt / f.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise MeshplanError(f"{path}: missing checkpoint file") from None
        if size != f.size_bytes:
            raise MeshplanError(
                f"{path}: truncated or changed ({size} bytes, the checkpoint wrote {f.size_bytes})"
            )


def load_meta(path: str | Path) -> tuple[Path, CheckpointMeta]:
    """Resolve ``path`` to a complete checkpoint, read its metadata and verify its files."""
    ckpt = resolve_checkpoint(path)
    meta = read_meta(ckpt)
    verify_files(ckpt, meta)
    return ckpt, meta


def check_same_model(ckpt: Path, saved: ModelSpec, current: ModelSpec) -> None:
    """Refuse a checkpoint made for another model, naming the first field that differs.

    The name is not compared (a preset and its HF config.json may name the same model
    differently); every shape-defining field is.
    """
    for f in fields(ModelSpec):
        if f.name == "name":
            continue
        a, b = getattr(saved, f.name), getattr(current, f.name)
        if a != b:
            raise MeshplanError(
                f"{ckpt}: checkpoint is for another model ({saved.name}: {f.name}={_show(a)}, "
                f"this job's {current.name}: {f.name}={_show(b)})"
            )


def _show(v: Any) -> str:
    return str(v.value) if hasattr(v, "value") else str(v)


def check_resume(root: str | Path, model: ModelSpec, *, resume: bool) -> Path | None:
    """What ``meshplan train --checkpoint-dir root [--resume]`` will load, checked before launching.

    Returns the checkpoint ``--resume`` continues from, or None for a fresh start (no checkpoint
    yet, or only interrupted saves). Refuses: a file instead of a directory, a non-empty directory
    that holds no checkpoint, a bad or foreign checkpoint, and (without ``--resume``) a directory
    whose checkpoints a fresh run would overwrite.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise MeshplanError(f"{root}: not a directory (--checkpoint-dir needs a directory)")
    if (root / META_FILENAME).is_file():
        raise MeshplanError(
            f"{root}: is one checkpoint; give its parent directory (--checkpoint-dir {root.parent})"
        )
    latest = latest_checkpoint(root)
    if not resume:
        if latest is not None:
            raise MeshplanError(
                f"{root}: already holds checkpoints (latest {latest.name}); pass --resume to continue "
                "from it, or choose another --checkpoint-dir"
            )
        return None
    if latest is None:
        entries = [c.name for c in root.iterdir()] if root.is_dir() else []
        if entries and not any(n.startswith("step-") for n in entries):
            raise MeshplanError(f"{root}: not a meshplan checkpoint directory (no step-* checkpoints in it)")
        return None
    ckpt, meta = load_meta(latest)
    check_same_model(ckpt, meta.job.model, model)
    return ckpt
