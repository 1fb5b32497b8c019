"""The published training runs shipped with meshplan, by name (``meshplan validate --runs NAME``).

The CSVs travel inside the package (``src/meshplan/data``, package data in pyproject.toml), so
``--runs calibration`` works from any install; their columns are described in
``src/meshplan/data/README.md``. Any other CSV of the same format is read by its path.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_path

PUBLISHED_RUNS: dict[str, str] = {
    "calibration": "runs_calibration.csv",
    "megatron-bridge": "runs_megatron_bridge.csv",
}
"""Name -> shipped file. ``calibration``: Megatron-LM 2021, Korthikanti et al. 2022, BLOOM and the
Megatron-LM README (the rows the calibration is fitted on). ``megatron-bridge``: NVIDIA
Megatron-Bridge's published performance tables (H100 to GB300)."""

DEFAULT_RUNS = "calibration"


def runs_csv(name_or_path: str) -> Path:
    """A shipped set by name, or a CSV file by path (a file of that name wins over a set's name)."""
    if name_or_path == "":
        raise MeshplanError("--runs: an empty path, expected a runs CSV or a shipped set")
    path = Path(name_or_path)
    if path.is_file():
        return path
    if name_or_path in PUBLISHED_RUNS:
        return shipped_path("meshplan.data", PUBLISHED_RUNS[name_or_path])
    if path.is_dir():
        raise MeshplanError(f"{path}: is a directory, expected a runs CSV")
    if path.exists():  # a device or a FIFO: reading it may never end
        raise MeshplanError(f"{path}: is not a regular file, expected a runs CSV")
    names = ", ".join(PUBLISHED_RUNS)
    raise MeshplanError(f"--runs {name_or_path}: no such file, nor a shipped set ({names})")
