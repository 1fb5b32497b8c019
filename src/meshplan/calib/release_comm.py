"""The expert all-to-all a stack release's presets ran, over the preset file's reading (issue 14).

``data/bridge_recipes.csv`` reads each Megatron-Bridge preset at one commit; an older release with
the same layout may have run another all-to-all (DeepSeek-V3's 25.09 / 25.11 presets: no HybridEP
on B200, no overlap on GB200). ``spec/presets/stack_releases.json`` dates it per release (entries'
``dispatch``, read by spec/stack_version.py ``release_dispatch``); a Megatron-Bridge row of that
release takes it here, costed as calib/recipes.py costs a preset's (``alltoall_values``,
``preset_dispatcher``).
"""

from __future__ import annotations

from typing import Any, Mapping

from meshplan.calib.recipe_overlay import Overlay, alltoall_values, preset_dispatcher
from meshplan.calib.recipes import COMM_COLUMNS, DISPATCHERS, FLEX_BACKENDS, CommSettings
from meshplan.errors import MeshplanError

__all__ = ["RELEASE_DISPATCH_KEYS", "comm_overlay", "release_comm"]

RELEASE_DISPATCH_KEYS = frozenset(COMM_COLUMNS)


def release_comm(dispatch: Mapping[str, Any], base: CommSettings | None, label: str) -> CommSettings:
    """``base`` (the row's preset's all-to-all, None: no preset) with what a stack release's presets
    ran (spec/stack_version.py ``release_dispatch``: bridge_recipes.csv is read at one commit, a
    row of an older release ran that release's file); a dispatcher named without a backend runs
    none. MeshplanError names a bad key or value of the data."""
    unknown = sorted(set(dispatch) - RELEASE_DISPATCH_KEYS)
    if unknown:
        raise MeshplanError(f"stack_releases.json dispatch: {unknown[0]!r} is not one of {', '.join(COMM_COLUMNS)}")
    kind = dispatch.get("moe_token_dispatcher_type", base.moe_token_dispatcher_type if base else "")
    backend = dispatch.get("moe_flex_dispatcher_backend",
                           (base.moe_flex_dispatcher_backend if base else "") if "moe_token_dispatcher_type" not in dispatch else "")
    overlap = dispatch.get("moe_a2a_overlap", base.moe_a2a_overlap if base else None)
    if kind not in ("", *DISPATCHERS) or (backend not in FLEX_BACKENDS if kind == "flex" else backend != ""):
        raise MeshplanError(f"stack_releases.json dispatch: dispatcher {kind!r} with backend {backend!r} is not "
                            f"alltoall, or flex with one of {', '.join(FLEX_BACKENDS)}")
    if overlap is not None and not isinstance(overlap, bool):
        raise MeshplanError(f"stack_releases.json dispatch: moe_a2a_overlap {overlap!r} is not true or false")
    return CommSettings(moe_a2a_overlap=overlap, moe_token_dispatcher_type=kind, moe_flex_dispatcher_backend=backend,
                        label=label)


def comm_overlay(comm: CommSettings) -> Overlay:
    """A row with no preset of its layout whose release's presets ran ``comm``: that all-to-all
    alone (its memory settings stay the row's and its framework's)."""
    values, notes = alltoall_values(comm)
    dispatcher, dispatcher_note = preset_dispatcher(comm)
    return Overlay(calibration_values=values, moe_dispatcher=dispatcher, notes=(*notes, *dispatcher_note))
