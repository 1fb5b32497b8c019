"""What a Megatron-Bridge performance preset really ran that its published row does not record.

NVIDIA's performance tables (``runs_megatron_bridge.csv``) give the parallel layout of each run but
not the memory settings of the preset behind it (``scripts/performance/configs/<family>/
*_workload_base_configs.py`` in NVIDIA-NeMo/Megatron-Bridge): Megatron FSDP, activation offload
(``cpu_offloading_num_layers``), full recompute of some layers (``recompute_num_layers``, method
``block``) or selective recompute of some modules (``recompute_modules``). Estimated without them a
run that offloaded or recomputed looks over the memory budget. ``bridge_recipes.csv`` (package
data, columns in ``src/meshplan/data/README.md``) holds those settings per preset, keyed by what
the row does give (model, GPU, precision, GPUs, batch and layout), each with the file and commit
it was read from.

The rows take those settings in ``calib/recipe_overlay.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from meshplan.errors import MeshplanError
from meshplan.plan import RecomputeModule
from meshplan.shipped import shipped_path
from meshplan.textfile import csv_records, read_text_file

KEY_COLUMNS = ("model", "gpu", "precision", "num_gpus", "global_batch_size", "micro_batch_size",
               "tp", "pp", "cp", "vpp", "ep")
"""What a published row gives and a preset fixes: a row takes a preset's settings only when all
of these are equal (presets change from one container to the next; a row run with another
layout ran another preset)."""
SETTING_COLUMNS = ("megatron_fsdp", "recompute_num_layers", "recompute_modules",
                   "cpu_offloading_num_layers")
RECIPE_COLUMNS = KEY_COLUMNS + SETTING_COLUMNS + ("config", "source")
COMM_COLUMNS = ("moe_a2a_overlap", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend")
"""The preset's expert all-to-all (optional columns: a file without them reads as all blank)."""
GRAD_REDUCE_COLUMN = "overlap_grad_reduce"
"""Optional column: 1 / 0, the preset's ``comm_overlap.overlap_grad_reduce`` (recipe_overlay.py's docstring);
blank: not read (the stack's overlap)."""
NOT_EXPRESSED_COLUMN = "not_expressed"
"""Optional column: a memory setting of the preset that meshplan cannot express, in words (blank:
none). A row of that preset is not estimated (:class:`NotExpressible`): a plan without the setting
would be another run."""
DISPATCHERS = ("alltoall", "flex")
"""``moe_token_dispatcher_type`` of a preset: Megatron-Bridge's set_workload_base_configs
(scripts/performance/utils/overrides.py) sets flex when the preset names a flex backend, else
alltoall."""
FLEX_BACKENDS = ("deepep", "hybridep")
SYNC_FREE_BACKENDS = frozenset({"hybridep"})
"""Flex backends with no host sync of the token counts per MoE layer (recipe_overlay.py's docstring); the
others (DeepEP) are costed as the flex dispatcher with ``Calibration.moe_flex_host_sync``."""
PRECISIONS = ("bf16", "fp16", "fp8", "fp4")
RECOMPUTE_MODULES = frozenset(m.value for m in RecomputeModule)
"""Megatron-Core's ``recompute_modules`` names (TransformerConfig, megatron/core 0.14+)."""
SOURCE_FRAMEWORK = "Megatron-Bridge"
"""Rows whose ``source`` starts with this ran Megatron-Bridge's presets."""
SHIPPED = "bridge_recipes.csv"

RecipeKey = tuple[str, str, str, int, int, int, int, int, int, int, int]


@dataclass(frozen=True, kw_only=True)
class BridgeRecipe:
    """The memory settings of one Megatron-Bridge preset (one row of bridge_recipes.csv)."""

    key: RecipeKey
    megatron_fsdp: bool
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...]
    cpu_offloading_num_layers: int | None
    moe_a2a_overlap: bool | None = None
    """``moe_a2a_overlap`` as the preset runs it; None: not read (the stack's overlap)."""
    moe_token_dispatcher_type: str = ""
    """'alltoall' or 'flex'; empty: not read."""
    moe_flex_dispatcher_backend: str = ""
    """Under flex: 'deepep' or 'hybridep'."""
    overlap_grad_reduce: bool | None = None
    """``comm_overlap.overlap_grad_reduce`` as the preset runs it; None: not read (on, the stack's)."""
    not_expressed: str = ""
    """A setting of the preset meshplan cannot express (NOT_EXPRESSED_COLUMN); empty: none."""
    config: str
    """The preset's name(s) in the source file."""
    source: str
    """``path@commit`` in NVIDIA-NeMo/Megatron-Bridge."""

    @property
    def label(self) -> str:
        return f"Megatron-Bridge preset {self.config}"

    @property
    def sync_free_dispatch(self) -> bool:
        return self.moe_token_dispatcher_type == "flex" and self.moe_flex_dispatcher_backend in SYNC_FREE_BACKENDS

    @property
    def comm(self) -> CommSettings:
        return CommSettings(moe_a2a_overlap=self.moe_a2a_overlap, moe_token_dispatcher_type=self.moe_token_dispatcher_type,
                            moe_flex_dispatcher_backend=self.moe_flex_dispatcher_backend, label=self.label)


@dataclass(frozen=True, kw_only=True)
class CommSettings:
    """A preset's expert all-to-all (the COMM_COLUMNS) and who says so: a row of bridge_recipes.csv,
    or a stack release's presets where the file's commit is not the release the row ran
    (calib/release_comm.py)."""

    moe_a2a_overlap: bool | None = None
    moe_token_dispatcher_type: str = ""
    moe_flex_dispatcher_backend: str = ""
    label: str

    @property
    def sync_free_dispatch(self) -> bool:
        return self.moe_token_dispatcher_type == "flex" and self.moe_flex_dispatcher_backend in SYNC_FREE_BACKENDS


class NotExpressible(MeshplanError):
    """A row ran a preset with a memory setting meshplan cannot express: the row is skipped
    (``load_runs`` lists it with this reason), not estimated without the setting."""


# ---- reading ---------------------------------------------------------------------------------
def _cell_int(raw: str, column: str, where: str, *, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise MeshplanError(f"{where}: column {column}: {raw!r} is not a whole number") from None
    if value < minimum:
        raise MeshplanError(f"{where}: column {column}: {value} is below {minimum}")
    return value


def _optional_int(raw: str, column: str, where: str, *, minimum: int) -> int | None:
    return _cell_int(raw, column, where, minimum=minimum) if raw else None


def parse_recipes(text: str, name: str) -> Mapping[RecipeKey, BridgeRecipe]:
    """The presets of a bridge_recipes.csv text by key; MeshplanError names the first bad cell."""
    out: dict[RecipeKey, BridgeRecipe] = {}
    first_line: dict[RecipeKey, int] = {}
    for n, row in enumerate(csv_records(text, name, required=RECIPE_COLUMNS, what="recipes CSV"), start=2):
        where = f"{name} line {n}"
        cells = {c: (row.get(c) or "").strip() for c in RECIPE_COLUMNS}
        for c in ("model", "gpu", "config", "source"):
            if not cells[c]:
                raise MeshplanError(f"{where}: column {c} is blank")
        if cells["precision"] not in PRECISIONS:
            raise MeshplanError(f"{where}: column precision: {cells['precision']!r} is not one of "
                                f"{', '.join(PRECISIONS)}")
        key: RecipeKey = (cells["model"], cells["gpu"], cells["precision"], *(
            _cell_int(cells[c], c, where, minimum=1) for c in KEY_COLUMNS[3:]))
        if cells["megatron_fsdp"] not in ("", "0", "1"):
            raise MeshplanError(f"{where}: column megatron_fsdp: {cells['megatron_fsdp']!r} is not 0, 1 "
                                "or blank")
        modules = tuple(m.strip() for m in cells["recompute_modules"].split("+") if m.strip())
        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise MeshplanError(f"{where}: column recompute_modules: {unknown[0]!r} is not one of "
                                f"{', '.join(sorted(RECOMPUTE_MODULES))}")
        comm = {c: (row.get(c) or "").strip() for c in COMM_COLUMNS}
        if comm["moe_a2a_overlap"] not in ("", "0", "1"):
            raise MeshplanError(f"{where}: column moe_a2a_overlap: {comm['moe_a2a_overlap']!r} is not 0, 1 "
                                "or blank")
        if comm["moe_token_dispatcher_type"] not in ("", *DISPATCHERS):
            raise MeshplanError(f"{where}: column moe_token_dispatcher_type: "
                                f"{comm['moe_token_dispatcher_type']!r} is not one of {', '.join(DISPATCHERS)}")
        flex = comm["moe_token_dispatcher_type"] == "flex"
        if (comm["moe_flex_dispatcher_backend"] not in FLEX_BACKENDS) if flex else comm["moe_flex_dispatcher_backend"]:
            raise MeshplanError(f"{where}: column moe_flex_dispatcher_backend: "
                                f"{comm['moe_flex_dispatcher_backend']!r} is not one of {', '.join(FLEX_BACKENDS)}"
                                + ("" if flex else " under moe_token_dispatcher_type flex (blank otherwise)"))
        grad_reduce = (row.get(GRAD_REDUCE_COLUMN) or "").strip()
        if grad_reduce not in ("", "0", "1"):
            raise MeshplanError(f"{where}: column {GRAD_REDUCE_COLUMN}: {grad_reduce!r} is not 0, 1 or blank")
        if key in out:
            raise MeshplanError(f"{where}: repeats the key of line {first_line[key]} "
                                f"({', '.join(map(str, key))}): one preset per layout")
        out[key] = BridgeRecipe(
            key=key, megatron_fsdp=cells["megatron_fsdp"] == "1",
            recompute_num_layers=_optional_int(cells["recompute_num_layers"], "recompute_num_layers",
                                               where, minimum=1),
            recompute_modules=modules,
            cpu_offloading_num_layers=_optional_int(cells["cpu_offloading_num_layers"],
                                                    "cpu_offloading_num_layers", where, minimum=1),
            moe_a2a_overlap=None if not comm["moe_a2a_overlap"] else comm["moe_a2a_overlap"] == "1",
            moe_token_dispatcher_type=comm["moe_token_dispatcher_type"],
            moe_flex_dispatcher_backend=comm["moe_flex_dispatcher_backend"],
            overlap_grad_reduce=None if not grad_reduce else grad_reduce == "1",
            not_expressed=(row.get(NOT_EXPRESSED_COLUMN) or "").strip(),
            config=cells["config"], source=cells["source"])
        first_line[key] = n
    return MappingProxyType(out)


def load_recipes(path: str | Path) -> Mapping[RecipeKey, BridgeRecipe]:
    p = Path(path)
    return parse_recipes(read_text_file(p, what="recipes CSV", missing="no such recipes file"), str(p))


@lru_cache(maxsize=1)
def shipped_recipes() -> Mapping[RecipeKey, BridgeRecipe]:
    """The presets shipped with meshplan (read once)."""
    return load_recipes(shipped_path("meshplan.data", SHIPPED))
