"""GPU names as published runs write them -> GPU presets (data: presets/gpu_aliases.json).

'H100-SXM5-80GB', 'NVIDIA H100 80GB HBM3', 'DGX H100' and 'h100-sxm' are one preset: a name is
read as a part ('h100'), a form factor ('sxm', 'pcie', ...) and a memory size in GB, in any order
and with any vendor words around them. A name that leaves the form or the memory out takes the
part's default preset, and says so; one that fits no preset, or more than one, is refused with the
candidates named (a run on a GPU without a preset cannot be estimated: no peak, no bandwidth).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_json
from meshplan.spec.cluster import gpu_names


@dataclass(frozen=True)
class GpuName:
    preset: str
    """Name in clusters.json 'gpus'."""
    note: str = ""
    """How the name was read when it left the form or the memory out ('' for a full name)."""


@dataclass(frozen=True)
class _Entry:
    preset: str
    part: str
    forms: tuple[str, ...]
    memory_gb: tuple[int, ...]
    default_form: bool
    default_memory: bool


@lru_cache(maxsize=1)
def _data() -> Mapping[str, Any]:
    return shipped_json("meshplan.spec", "presets/gpu_aliases.json")


@lru_cache(maxsize=1)
def _entries() -> tuple[_Entry, ...]:
    return tuple(_Entry(preset=k, part=v["part"], forms=tuple(v["forms"]), memory_gb=tuple(v["memory_gb"]),
                        default_form=bool(v["default_form"]), default_memory=bool(v["default_memory"]))
                 for k, v in _data()["gpus"].items())


_MEMORY = re.compile(r"(\d+)\s*g(?:i?b)?(?![a-z0-9])")
"""'80GB', '80 GB', '80G', '80GiB' -> one memory token (not the 'gb' of 'gb200')."""
_COUNT = re.compile(r"\d+x")
"""'8x' in '8x H100': a count of GPUs, not part of the name."""


def gpu_tokens(name: str) -> tuple[str, ...]:
    """The tokens of a GPU name, vendor words dropped and form words folded: 'NVIDIA H100-SXM5-80GB'
    -> ('80gb', 'h100', 'sxm')."""
    text = _MEMORY.sub(lambda m: f" {m.group(1)}gb ", name.lower().replace("pci-e", "pcie"))
    ignored, forms = set(_data()["ignored"]), _data()["forms"]
    tokens = {forms.get(t, t) for t in re.split(r"[^a-z0-9.]+", text)
              if t and t not in ignored and not _COUNT.fullmatch(t)}
    return tuple(sorted(tokens))


def resolve_gpu(name: str) -> GpuName:
    """The preset a published GPU name means; MeshplanError naming the candidates when none or
    several fit."""
    if name.strip().lower() in gpu_names():
        return GpuName(name.strip().lower())
    entries = _entries()
    tokens = gpu_tokens(name)
    parts = {e.part for e in entries}
    forms = set(_data()["forms"].values())
    part = [t for t in tokens if t in parts]
    form = [t for t in tokens if t in forms]
    memory = [int(t[:-2]) for t in tokens if re.fullmatch(r"\d+gb", t)]
    rest = [t for t in tokens if t not in parts and t not in forms and not re.fullmatch(r"\d+gb", t)]
    known = ", ".join(e.preset for e in entries)
    if len(part) != 1 or len(form) > 1 or len(memory) > 1 or rest:
        raise MeshplanError(f"unknown GPU {name!r}; known: {known}")
    fits = [e for e in entries if e.part == part[0]
            and (not form or form[0] in e.forms) and (not memory or memory[0] in e.memory_gb)]
    if not form:
        fits = [e for e in fits if e.default_form]
    if not memory and len(fits) > 1:
        fits = [e for e in fits if e.default_memory] or fits
    if not fits:
        same = ", ".join(e.preset for e in entries if e.part == part[0])
        raise MeshplanError(f"no GPU preset matches {name!r} (presets of the {part[0]}: {same})")
    if len(fits) > 1 or (not memory and not fits[0].default_memory):
        raise MeshplanError(f"GPU {name!r} does not say its memory size "
                            f"(presets: {', '.join(e.preset for e in fits)}): give it, e.g. '{part[0]} {fits[0].memory_gb[0]}GB'")
    chosen = fits[0]
    unsaid = [w for w, given, e_vals in (("form", form, chosen.forms), ("memory", memory, chosen.memory_gb))
              if not given and e_vals]
    if not unsaid or sum(e.part == chosen.part for e in entries) == 1:
        return GpuName(chosen.preset)  # the part's only preset: nothing was chosen
    said = "; ".join(f"{w} not given: {_show(w, chosen)}" for w in unsaid)
    return GpuName(chosen.preset, f"gpu: {name!r} read as {chosen.preset} ({said})")


def _show(what: str, e: _Entry) -> str:
    return e.forms[0].upper() if what == "form" else f"{e.memory_gb[0]} GB"
