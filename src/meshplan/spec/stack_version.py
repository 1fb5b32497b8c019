"""The release of a training stack is part of the stack (issue 14, items 2 and 6).

The same plan ran 1.3-1.8x faster on Megatron-Bridge's 26.06 containers than on 26.04 for some
MoE models and not for dense ones: the 26.06 presets of those models turned on mechanisms the
cost model has (full-iteration CUDA graphs over a sync-free MoE layer, one fused grouped kernel
for the experts, FP8 attention). A release is read from a runs row (its ``framework``:
'megatron-core 0.16', 'megatron-bridge 26.06'; else its ``source``: 'Megatron-Bridge 26.06.01'),
and selects Calibration field values from data (presets/stack_releases.json, each with its
source); nothing here is fitted. A release the data does not name selects nothing: the stack's
defaults, with no error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from meshplan.shipped import shipped_json

RELEASES_FILE = "presets/stack_releases.json"

_CONTAINER = re.compile(r"(?<![\d.])(\d{2})\.(\d{2})(?:\.(\d{1,2}))?(?![\d.])")
"""A container release: '26.06', '26.06.01' (year.month[.patch])."""
_LIBRARY = re.compile(r"^(?P<name>[a-z][a-z-]*?)-v?(?P<version>\d+\.\d+(?:\.\d+)*)")
"""A library and its version after framework_key's folding: 'megatron-core-0.16.0'."""
_SOURCE = re.compile(r"(megatron[\s_-]*bridge|nemo(?:[\s_-]*framework)?)\D{0,40}?(\d{2}\.\d{2}(?:\.\d{1,2})?)",
                     re.IGNORECASE)
"""A container named in a row's source: 'Megatron-Bridge 26.06.01', 'NeMo Framework ... 25.04'."""


@lru_cache(maxsize=1)
def _data() -> Mapping[str, Any]:
    raw = shipped_json("meshplan.spec", RELEASES_FILE)
    return MappingProxyType({k: v for k, v in raw.items() if not k.startswith("_")})


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


def container_release(text: str) -> str | None:
    """'26.06' for '26.06', '26.06.01' or 'v26.06'; None when the text holds no container release."""
    m = _CONTAINER.search(text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def release_of(stack: str, framework: str | None, source: str | None = None) -> str | None:
    """The container release of ``stack`` a row ran: from its framework string ('megatron-bridge
    26.06', 'megatron-core 0.16', 'nemo 26.04'), else from its source ('Megatron-Bridge 26.06.01');
    None when neither names one. A library version maps to its container through the data's
    ``version_aliases`` (Megatron Core 0.16 shipped in 26.02); one it does not list is None."""
    table = _data().get(stack)
    if table is None:
        return None
    key = _key(framework or "")
    m = _LIBRARY.match(key)
    if m:
        aliases = table.get("version_aliases", {}).get(m.group("name"), {})
        major_minor = ".".join(m.group("version").split(".")[:2])
        if major_minor in aliases:
            return aliases[major_minor]
    found = container_release(key.replace("-", " "))
    if found is not None:
        return found
    m = _SOURCE.search(source or "")
    return container_release(m.group(2)) if m else None


def known_release(stack: str, release: str | None) -> bool:
    """Whether the data names ``release`` of ``stack`` (else the stack's defaults apply)."""
    table = _data().get(stack)
    return bool(table and release in table["releases"])


def current_release(stack: str) -> str | None:
    """The release ``--target <stack>`` stands for (the newest the data describes), or None."""
    table = _data().get(stack)
    return table["current"] if table else None


def _order(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def _covers(entry: Mapping[str, Any], release: str, *, family: str, gpu: str, precision: str,
            moe: bool, model: str | None) -> bool:
    """Whether a preset entry covers this run: from its release ``since`` on and, where it names
    one, before its release ``before`` (a setting a later release changed), for its families,
    GPUs, precisions, MoE or dense, and the model presets it names."""
    return (_order(release) >= _order(entry["since"])
            and ("before" not in entry or _order(release) < _order(entry["before"]))
            and family in entry["families"] and gpu in entry["gpus"] and precision in entry["precisions"]
            and moe == entry.get("moe", moe) and ("models" not in entry or model in entry["models"]))


def _merged(key: str, stack: str, release: str | None, **run: Any) -> dict[str, Any]:
    if not known_release(stack, release):
        return {}
    out: dict[str, Any] = {}
    for entry in _data()[stack].get("presets", ()):
        if key in entry and _covers(entry, release, **run):
            out.update(entry[key])
    return out


def release_values(stack: str, release: str | None, *, family: str, gpu: str, precision: str,
                   moe: bool, model: str | None = None) -> dict[str, Any]:
    """Calibration field values the presets of ``release`` set for a run of this model family
    (``moe``: a mixture-of-experts model; ``model``: the model preset, read by entries that name
    ``models``) on this GPU preset in this precision; {} for an unnamed release, another stack,
    or a run no preset of the release covers."""
    return _merged("values", stack, release, family=family, gpu=gpu, precision=precision, moe=moe, model=model)


def release_dispatch(stack: str, release: str | None, *, family: str, gpu: str, precision: str,
                     moe: bool, model: str | None = None) -> dict[str, Any]:
    """How the presets of ``release`` ran the expert all-to-all of this run, where the data says
    (entries' ``dispatch``: Megatron-Bridge's ``moe_token_dispatcher_type``,
    ``moe_flex_dispatcher_backend``, ``moe_a2a_overlap``, the columns of data/bridge_recipes.csv,
    which are read at one commit and hold for the releases that commit's presets ran): {} where
    none says. Applied over the row's preset by calib/release_comm.py."""
    return _merged("dispatch", stack, release, family=family, gpu=gpu, precision=precision, moe=moe, model=model)


def release_notes(stack: str, release: str | None, values: Mapping[str, Any]) -> str:
    """One line for a row's ``assumed``: which release it ran and what its presets set."""
    if not known_release(stack, release):
        return ""
    what = ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "the stack's defaults"
    return f"release: {stack} {release} ({what}; spec/presets/stack_releases.json)"
