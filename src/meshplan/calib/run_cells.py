"""The cells of a runs CSV (the format of runs_calibration.csv): its columns, and the numbers in
them read strictly (text, nan or inf in a numeric column is a malformed file, not a run to skip)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from meshplan.errors import MeshplanError
from meshplan.numbers import MAX_COUNT
from meshplan.textfile import csv_records, read_text_file

REQUIRED_COLUMNS = (
    "id", "source", "model", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
    "ffn_hidden_size", "vocab_size", "seq_len", "gpu", "num_gpus", "gpus_per_node",
    "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "ep", "vpp", "zero",
    "sequence_parallel", "recompute", "precision", "measured_tflops_per_gpu", "flops_basis",
    "measured_mfu", "measured_tokens_per_s_per_gpu", "measured_step_time_s",
    "measured_peak_mem_gib", "notes",
)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    text = read_text_file(p, what="runs CSV", missing="no such runs file")
    return [dict(r) for r in csv_records(text, str(p), required=REQUIRED_COLUMNS, what="runs CSV")]


class MalformedCell(MeshplanError):
    """A numeric column holding text, nan or inf: the file is wrong, not the run (load_runs
    refuses the file instead of skipping the row)."""


def cell(row: dict[str, str], key: str, cast: Callable[[str], Any], default: Any = None) -> Any:
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is None:
            return None
        return default
    try:
        value = cast(raw)
    except MalformedCell as exc:
        raise MalformedCell(f"column {key}: {exc}") from None
    except (ValueError, OverflowError):
        raise MalformedCell(f"column {key}: {raw!r} is not a {'number' if cast is float else 'whole number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise MalformedCell(f"column {key}: {raw!r} is not finite")
    return value


def whole_number(raw: str) -> int:
    f = float(raw)
    if not math.isfinite(f) or f != int(f):
        raise ValueError(raw)
    if abs(f) > MAX_COUNT:
        raise MalformedCell(f"{raw!r} is too large (at most {MAX_COUNT:,})")
    return int(f)


def required_cell(row: dict[str, str], key: str, cast=whole_number) -> Any:
    v = cell(row, key, cast)
    if v is None:
        raise MeshplanError(f"{key} is blank")
    return v
