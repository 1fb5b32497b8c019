"""Megatron-Core's pipeline layout string (``--pipeline-model-parallel-layout``), read and written.

The layout names what every virtual pipeline stage holds, in model order (stage ``i`` on pipeline
rank ``i % pp``): stages are separated by ``|``; ``E`` is the embedding (first stage), ``t`` one
transformer (decoder) layer, ``m`` one multi-token-prediction module, ``L`` the final norm, LM head
and loss (last stage); ``x*N`` repeats one symbol, ``(...)*N`` a group (separators included);
commas are cosmetic; an empty stage is allowed (``E||t|L``). Source: Megatron-Core user guide,
"Custom Pipeline Model Parallel Layout" (docs.nvidia.com/megatron-core, features/
pipeline_parallel_layout), e.g. DeepSeek-V3 on pp16 vpp2: ``Et*3|(tt|)*29,m|L``.

meshplan keeps of it the transformer layers per virtual stage (``Plan.stage_layers``) and the stage
holding the MTP modules (``Plan.mtp_stage``); the embedding and the loss sit on the first and last
stage, as in every plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.errors import MeshplanError

SYMBOLS = "EtmL"
"""Embedding, transformer layer, MTP module, loss (Megatron-Core's layer-type letters)."""
MAX_EXPANDED_CHARS = 100_000
"""A layout expands to one letter per layer; a longer expansion is a typo (``t*10000000``), not
a model (the deepest published stacks have a few hundred layers)."""

_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT = re.compile(r"([EtmL|])\*(\d+)")


@dataclass(frozen=True)
class PipelineLayout:
    """What a layout string says, in meshplan's terms."""

    stage_layers: tuple[int, ...]
    """Transformer layers per virtual stage, in model order."""
    mtp_stage: int | None
    """The virtual stage holding the MTP modules; None when the layout has none."""
    mtp_layers: int
    """How many MTP modules (``m``) the layout holds."""


def _expand(layout: str) -> str:
    text = layout.replace("\\", "").replace(" ", "").replace(",", "")
    for _ in range(len(text) + 1):  # each pass removes one level of parentheses
        if not _GROUP.search(text):
            break
        text = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), text)
        if len(text) > MAX_EXPANDED_CHARS:
            raise MeshplanError(f"pipeline layout {layout!r} expands to more than {MAX_EXPANDED_CHARS:,} symbols")
    if any(int(n) > MAX_EXPANDED_CHARS for n in re.findall(r"\*(\d+)", text)):
        raise MeshplanError(f"pipeline layout {layout!r} expands to more than {MAX_EXPANDED_CHARS:,} symbols")
    text = _REPEAT.sub(lambda g: g.group(1) * int(g.group(2)), text)
    bad = re.search(r"[^EtmL|]", text)
    if bad:
        raise MeshplanError(f"pipeline layout {layout!r}: {bad.group()!r} is not a stage separator '|' or a "
                            f"layer symbol (E embedding, t transformer layer, m MTP module, L loss; "
                            f"repeat with x*N or (...)*N)")
    return text


def parse_layout(layout: str) -> PipelineLayout:
    """The stages of a Megatron layout string; MeshplanError names what is malformed."""
    if not layout.strip():
        raise MeshplanError("pipeline layout is empty")
    chunks = _expand(layout).split("|")
    mtp_stages = sorted({i for i, c in enumerate(chunks) if "m" in c})
    for i, chunk in enumerate(chunks):
        if "E" in chunk and (i or chunk.count("E") > 1 or not chunk.startswith("E")):
            raise MeshplanError(f"pipeline layout {layout!r}: the embedding E must open the first stage, once")
        if "L" in chunk and (i != len(chunks) - 1 or chunk.count("L") > 1 or not chunk.endswith("L")):
            raise MeshplanError(f"pipeline layout {layout!r}: the loss L must close the last stage, once")
        if "m" in chunk and "t" in chunk[chunk.index("m"):]:
            raise MeshplanError(f"pipeline layout {layout!r}: stage {i} has a transformer layer after an MTP "
                                "module (MTP modules run after the whole stack)")
    if not chunks[0].startswith("E") or not chunks[-1].endswith("L"):
        raise MeshplanError(f"pipeline layout {layout!r}: the first stage must hold the embedding E and the "
                            "last the loss L")
    if len(mtp_stages) > 1:
        raise MeshplanError(f"pipeline layout {layout!r}: MTP modules on stages {mtp_stages}; meshplan places "
                            "them all on one stage")
    counts = tuple(c.count("t") for c in chunks)
    if mtp_stages and any(counts[mtp_stages[0] + 1:]):
        raise MeshplanError(f"pipeline layout {layout!r}: transformer layers after the MTP modules "
                            f"(stage {mtp_stages[0]}); they run after the whole stack")
    return PipelineLayout(stage_layers=counts, mtp_stage=mtp_stages[0] if mtp_stages else None,
                          mtp_layers=sum(c.count("m") for c in chunks))


def looks_like_layout(text: str) -> bool:
    """Whether a ``--stage-layers`` value is a Megatron layout (letters) rather than counts."""
    return any(s in text for s in SYMBOLS + "|")


def format_layout(stage_layers: tuple[int, ...], *, mtp_layers: int = 0, mtp_stage: int | None = None) -> str:
    """The layout string of a split: one ``|``-separated stage per virtual stage in model order,
    ``t*N`` for N layers, ``m`` per MTP module on ``mtp_stage`` (None: the last stage), ``E`` and
    ``L`` on the first and last stage. :func:`parse_layout` reads it back."""
    if not stage_layers:
        raise MeshplanError("a pipeline layout needs at least one stage")
    where = len(stage_layers) - 1 if mtp_stage is None else mtp_stage
    chunks = []
    for i, n in enumerate(stage_layers):
        chunk = f"t*{n}" if n > 1 else "t" * n
        if mtp_layers and i == where:
            chunk += f"m*{mtp_layers}" if mtp_layers > 1 else "m"
        chunks.append(chunk)
    chunks[0] = "E" + chunks[0]
    chunks[-1] += "L"
    return "|".join(chunks)
