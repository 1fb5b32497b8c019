"""torchtitan >= 0.3 command line (``--module M --config F --section.field value ...``) -> the
same section/field dict a TOML job file gives, so that one importer reads both forms.

Only what the plan depends on is read (training batch, sequence, precision; parallelism; the
activation_checkpoint subcommand); other options are listed as ignored. A field the command line
does not set keeps torchtitan's dataclass default, not the config function's own value (meshplan
cannot run the config function): the exporter writes every field it maps for that reason.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.export.torchtitan_cli import FIRST_STAGE_MODULES, LAST_STAGE_MODULES, REGISTRY

SECTIONS = ("training", "parallelism")
AC_SUBCOMMAND = "activation_checkpoint:"
AC_MODES = ("full", "selective", "none", "memory-budget")
"""The subcommands of Trainer.Config.activation_checkpoint (torchtitan 0.3.0)."""
DEFAULT_AC_MODE = "selective"
"""Trainer.Config's default policy (SelectiveAC.Config) when no subcommand is given."""


@dataclass(frozen=True)
class ParsedCommand:
    cfg: dict[str, dict[str, Any]]
    """TOML-shaped: section -> field -> value."""
    module: str | None
    config: str | None
    ignored: tuple[str, ...]


def looks_like_command_line(text: str) -> bool:
    """A torchtitan command line names its config function; a TOML file has [sections]."""
    return "--module" in text or "--config" in text


def _scalar(v: str) -> Any:
    return int(v) if v.lstrip("-").isdigit() else v


def _words(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    try:
        return shlex.split(" ".join(ln.rstrip().removesuffix("\\") for ln in lines))
    except ValueError as exc:
        raise MeshplanError(f"torchtitan command line cannot be split into words ({exc})") from None


def parse_command_line(text: str) -> ParsedCommand:
    words = _words(text)
    cfg: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    cfg["activation_checkpoint"] = {"mode": DEFAULT_AC_MODE, "selective_ac_option": "op"}
    module = config = None
    ignored: list[str] = []
    i = words.index("--module") if "--module" in words else 0  # skip a launcher prefix
    while i < len(words):
        w = words[i]
        i += 1
        if w.startswith(AC_SUBCOMMAND):
            mode = w[len(AC_SUBCOMMAND):]
            if mode not in AC_MODES:
                raise MeshplanError(f"torchtitan activation_checkpoint subcommand {mode!r} is not one of "
                                    f"{', '.join(AC_MODES)}")
            cfg["activation_checkpoint"]["mode"] = mode
            continue
        if not w.startswith("--"):
            raise MeshplanError(f"torchtitan command line: {w!r} is not an option")
        name, eq, inline = w[2:].partition("=")
        values = [inline] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--") \
                and not words[i].startswith(AC_SUBCOMMAND):
            values.append(words[i])
            i += 1
        section, _, field = name.replace("-", "_").partition(".")
        if name == "module":
            module = _one(name, values)
        elif name == "config":
            config = _one(name, values)
        elif section in SECTIONS and field and values:
            cfg[section][field] = _scalar(values[0]) if len(values) == 1 else values
        else:
            ignored.append(f"--{name}")
    if cfg["activation_checkpoint"]["mode"] == "memory-budget":
        raise MeshplanError("torchtitan's memory-budget checkpointing leaves the choice to the "
                            "compiler: meshplan cannot say which activations it keeps")
    par = cfg["parallelism"]
    if "module_fqns_per_model_part" in par:
        parts = par.pop("module_fqns_per_model_part")
        par["pipeline_parallel_split_points"] = split_points_from_parts(
            parts if isinstance(parts, list) else [parts])
    return ParsedCommand(cfg, module, config, tuple(ignored))


def _one(name: str, values: list[str]) -> str:
    if len(values) != 1:
        raise MeshplanError(f"torchtitan command line: --{name} takes one value, got {values}")
    return values[0]


def split_points_from_parts(parts: list[str]) -> list[str]:
    """Comma-separated module names per stage -> the first block of every stage but the first,
    checking that the blocks run in order and the embeddings and head sit at the ends."""
    names = [str(p).split(",") for p in parts]
    blocks: list[list[int]] = []
    for k, stage in enumerate(names):
        extra = set(FIRST_STAGE_MODULES if k == 0 else ()) | set(LAST_STAGE_MODULES if k == len(names) - 1 else ())
        idx = []
        for n in stage:
            head, _, num = n.partition(".")
            if head == "layers" and num.isdigit():
                idx.append(int(num))
            elif n not in extra:
                raise MeshplanError(f"torchtitan module {n!r} in stage {k} is not a block (layers.<i>) "
                                    "or the embeddings/head at the ends")
        if not idx and not (extra and set(stage) <= extra):  # an end may hold the embedding / head alone
            raise MeshplanError(f"torchtitan pipeline stage {k} holds no block")
        blocks.append(idx)
    flat = [j for idx in blocks for j in idx]
    if flat != list(range(len(flat))):
        raise MeshplanError("torchtitan module_fqns_per_model_part does not list layers 0.. in order")
    # a stage's split point is its first block; an empty stage's is the next block (the layer count
    # after the last), so an empty first / last stage is a zero-length stage at that end
    starts, nxt = [], len(flat)
    for idx in reversed(blocks[1:]):
        nxt = idx[0] if idx else nxt
        starts.append(nxt)
    return [f"layers.{i}" for i in reversed(starts)]


def preset_for(module: str | None, config: str | None) -> str | None:
    """The meshplan preset a torchtitan config function builds, when known."""
    for preset, entry in REGISTRY.items():
        if entry == (module, config):
            return preset
    return None
