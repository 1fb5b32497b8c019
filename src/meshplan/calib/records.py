"""Write fitted (generation, stack) records into a calibration data file, with their source.

``meshplan validate --fit --write-calibration --out PATH`` calls this so that a refit (after a
branch adds a cost mechanism) is one command, and the numbers the cost model reads stay data with
a source. PATH is never the shipped file by default: a new PATH is the shipped file with the refit
records; an existing one (the shipped file included) is replaced only when the user says
``--force`` (:func:`check_target`).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any, Mapping

from meshplan.calib.fit import FIT_RESTARTS, FIT_ROUNDS, MEMORY_GRID, PRIOR_WEIGHT, TIME_GRID, FitResult
from meshplan.calib.fit_search import FIT_SEED
from meshplan.cost.calibration import FITTED_FILE
from meshplan.errors import MeshplanError
from meshplan.shipped import shipped_path
from meshplan.textfile import check_writable, read_text_file


def fitted_file() -> Path:
    """The data file in the installed package (a source checkout: src/meshplan/spec/presets)."""
    return shipped_path("meshplan.spec", FITTED_FILE)


def record(res: FitResult, runs_name: str, today: str) -> dict[str, Any]:
    fixed = ", ".join(f"{k}={v}" for k, v in sorted(res.settings.items()))
    return {
        "source": f"fitted on {runs_name} ({res.key} rows) by meshplan validate --fit --write-calibration, {today}",
        "how": (f"coordinate descent over grids with perturbed restarts (calib/fit.py, calib/fit_search.py: "
                f"{FIT_ROUNDS} sweeps at most per descent, {FIT_RESTARTS} restarts, seed {FIT_SEED}) minimising the mean absolute log error of "
                f"throughput over {res.throughput_rows} rows (median error {res.throughput_error_before:.1%} "
                f"-> {res.throughput_error_after:.1%}) and the mean absolute error of peak memory over "
                f"{res.memory_rows} rows; time fields inside their physical ranges with a weak prior "
                f"toward their start ({PRIOR_WEIGHT} per range crossed, calib/priors.py); "
                f"fields fixed by the rows' framework: {fixed or 'none'}; "
                f"{len(res.values)} constants moved from their start (defaults and the stack's "
                f"mechanisms) over the grids of {len(TIME_GRID)} time and {len(MEMORY_GRID)} memory fields"),
        "values": {k: float(v) for k, v in res.values.items()},
    }


def read_calibration_data(path: Path) -> dict[str, Any]:
    """A calibration data file as JSON: an object with a 'records' object (MeshplanError naming
    the file otherwise)."""
    what = "calibration data file"
    try:
        data = json.loads(read_text_file(path, what=what))
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{path}: not JSON ({exc.msg}, line {exc.lineno}), expected a {what}") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), dict):
        raise MeshplanError(f"{path}: not a {what} (no \"records\" object)")
    return data


def check_target(path: Path, *, force: bool) -> None:
    """Before the fit: ``path`` can be written, and is replaced only with ``force`` (it must then
    be a calibration data file already: its other records are kept)."""
    if path.exists():
        if not force:
            shipped = " (the shipped calibration)" if _same_file(path, fitted_file()) else ""
            raise MeshplanError(f"--out {path}{shipped} exists: give --force to replace its refit records, "
                                "or a new path")
        read_calibration_data(path)
    check_writable(path, what="calibration data file")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_records(fits: Mapping[str, FitResult], runs_name: str, path: Path) -> Path:
    """Replace the records of ``fits``' keys in ``path`` (a new path: in a copy of the shipped
    file), keep every other entry."""
    data = read_calibration_data(path if path.exists() else fitted_file())
    today = _dt.date.today().isoformat()
    for key, res in sorted(fits.items()):
        data["records"][key] = record(res, runs_name, today)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
