"""Write fitted (generation, stack) records into the calibration data file, with their source.

``meshplan validate --fit --write-calibration`` calls this so that a refit (after a branch adds a
cost mechanism) is one command, and the numbers the cost model reads stay data with a source.
"""

from __future__ import annotations

import datetime as _dt
import json
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from meshplan.calib.fit import MEMORY_GRID, TIME_GRID, FitResult
from meshplan.cost.calibration import FITTED_FILE


def fitted_file() -> Path:
    """The data file in the installed package (a source checkout: src/meshplan/spec/presets)."""
    return Path(str(resources.files("meshplan.spec").joinpath(FITTED_FILE)))


def record(res: FitResult, runs_name: str, today: str) -> dict[str, Any]:
    fixed = ", ".join(f"{k}={v}" for k, v in sorted(res.settings.items()))
    return {
        "source": f"fitted on {runs_name} ({res.key} rows) by meshplan validate --fit --write-calibration, {today}",
        "how": (f"coordinate descent over grids (calib/fit.py) minimising the mean absolute log error of "
                f"throughput over {res.throughput_rows} rows (median error {res.throughput_error_before:.1%} "
                f"-> {res.throughput_error_after:.1%}) and the mean absolute error of peak memory over "
                f"{res.memory_rows} rows; "
                f"fields fixed by the rows' framework: {fixed or 'none'}; "
                f"{len(res.values)} constants moved from their start (defaults and the stack's "
                f"mechanisms) over the grids of {len(TIME_GRID)} time and {len(MEMORY_GRID)} memory fields"),
        "values": {k: float(v) for k, v in res.values.items()},
    }


def write_records(fits: Mapping[str, FitResult], runs_name: str, path: Path | None = None) -> Path:
    """Replace the records of ``fits``' keys in the data file, keep every other entry."""
    path = path or fitted_file()
    data = json.loads(path.read_text())
    today = _dt.date.today().isoformat()
    for key, res in sorted(fits.items()):
        data["records"][key] = record(res, runs_name, today)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
