"""The pipeline layouts Megatron-Bridge's recipes run, for the published rows that do not print them.

NVIDIA's performance tables give a run's ``pp`` and ``vpp`` but not how the layers were split over
the stages. Megatron-Bridge's DeepSeek-V3 and Kimi-K2 recipes set
``pipeline_model_parallel_layout`` per ``(pp, vpp)`` (the recipe's layout map), which a performance
preset may override with its own ``pp_layout``: the first stage holds the embedding and fewer
layers, the last the MTP module, the LM head and the loss with one layer or none (DeepSeek-V3 on
pp16: ``Et*4|(t*4|)*14tmL``, 4 layers on every stage but the last, which holds 1 + MTP + loss).
Split evenly instead, the last stage holds 3 layers + MTP + two LM-head passes and the estimate
runs at its pace.

``bridge_layouts.csv`` (package data, columns in ``src/meshplan/data/README.md``) holds one layout
per (model, pp, vpp) with the file and commit it was read from; a Megatron-Bridge row of that model
and layout runs it (:func:`find_layout`), turned into ``Plan.stage_layers`` and ``Plan.mtp_stage``
by :func:`meshplan.plan.parse_layout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from meshplan.calib.recipe_overlay import is_bridge_row
from meshplan.errors import MeshplanError
from meshplan.plan import PipelineLayout, parse_layout
from meshplan.shipped import shipped_path
from meshplan.textfile import csv_records, read_text_file

LAYOUT_COLUMNS = ("model", "pp", "vpp", "pp_layout", "config", "source")
SHIPPED = "bridge_layouts.csv"

LayoutKey = tuple[str, int, int]
"""(model preset, pp, vpp)."""


@dataclass(frozen=True, kw_only=True)
class BridgeLayout:
    """One row of bridge_layouts.csv: the layout a recipe runs for one (model, pp, vpp)."""

    key: LayoutKey
    text: str
    """Megatron's layout string, as the recipe writes it."""
    layout: PipelineLayout
    config: str
    """Where in the source the layout is set (the layout map's key or the preset's name)."""
    source: str
    """``path@commit`` in NVIDIA-NeMo/Megatron-Bridge."""

    @property
    def note(self) -> str:
        return f"pipeline layout: {self.text} (Megatron-Bridge {self.config})"


def _count(raw: str, column: str, where: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise MeshplanError(f"{where}: column {column}: {raw!r} is not a whole number") from None
    if value < 1:
        raise MeshplanError(f"{where}: column {column}: {value} is below 1")
    return value


def parse_layouts(text: str, name: str) -> Mapping[LayoutKey, BridgeLayout]:
    """The layouts of a bridge_layouts.csv text by key; MeshplanError names the first bad cell."""
    out: dict[LayoutKey, BridgeLayout] = {}
    for n, row in enumerate(csv_records(text, name, required=LAYOUT_COLUMNS, what="layouts CSV"), start=2):
        where = f"{name} line {n}"
        cells = {c: (row.get(c) or "").strip() for c in LAYOUT_COLUMNS}
        blank = [c for c in ("model", "pp_layout", "config", "source") if not cells[c]]
        if blank:
            raise MeshplanError(f"{where}: column {blank[0]} is blank")
        key = (cells["model"], _count(cells["pp"], "pp", where), _count(cells["vpp"], "vpp", where))
        try:
            layout = parse_layout(cells["pp_layout"])
        except MeshplanError as exc:
            raise MeshplanError(f"{where}: {exc}") from None
        if len(layout.stage_layers) != key[1] * key[2]:
            raise MeshplanError(f"{where}: the layout has {len(layout.stage_layers)} stages, pp*vpp = "
                                f"{key[1] * key[2]}")
        if key in out:
            raise MeshplanError(f"{where}: repeats ({', '.join(map(str, key))}): one layout per model and layout")
        out[key] = BridgeLayout(key=key, text=cells["pp_layout"], layout=layout, config=cells["config"],
                                source=cells["source"])
    return MappingProxyType(out)


def load_layouts(path: str | Path) -> Mapping[LayoutKey, BridgeLayout]:
    p = Path(path)
    return parse_layouts(read_text_file(p, what="layouts CSV", missing="no such layouts file"), str(p))


@lru_cache(maxsize=1)
def shipped_layouts() -> Mapping[LayoutKey, BridgeLayout]:
    """The layouts shipped with meshplan (read once)."""
    return load_layouts(shipped_path("meshplan.data", SHIPPED))


def find_layout(row: Mapping[str, str], key: LayoutKey,
                layouts: Mapping[LayoutKey, BridgeLayout] | None = None) -> BridgeLayout | None:
    """The layout a Megatron-Bridge row ran, or None (another source, or no layout of that key)."""
    if not is_bridge_row(row):
        return None
    return (shipped_layouts() if layouts is None else layouts).get(key)
