"""A restricted refit of the shipped calibration's Megatron-Bridge records, shared by the benches
that ask what one mechanism changes (bench_overhead_per_token.py, bench_host_pacing.py): per
(generation, megatron) record, only ``fields`` are refitted (calib/fit.py ``fit_rows``, warm from
the shipped values), every other field kept at its shipped value, with the megatron stack's
``flags`` set."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.calib.fit import calibration_key, fit_rows, fit_start, shared_settings
from meshplan.calib.validate import Run

KEYS = ("blackwell/megatron", "blackwell-ultra/megatron", "hopper/megatron")


def refit_records(shipped: dict, runs: Sequence[Run], fields: Mapping[str, Sequence[float]],
                  flags: Mapping[str, Any], held: Mapping[str, Any] | None = None,
                  keys: Sequence[str] = KEYS) -> dict:
    """The calibration file ``shipped`` with the megatron stack's ``flags`` on and each record of
    ``keys`` (default ``KEYS``) refitted over ``fields`` (``held``: fields fixed at these values instead of the
    shipped ones); prints each record's values and median error."""
    out = copy.deepcopy(shipped)
    out["stacks"]["megatron"]["values"].update(flags)
    for key in keys:
        rows = [r for r in runs if calibration_key(r) == key]
        rec = shipped["records"][key]["values"]
        kept = {**{k: v for k, v in rec.items() if k not in fields}, **(held or {})}
        settings = {**shared_settings(rows, {}), **kept, **flags}
        began = time.process_time()
        start = fit_start(rows[0].stack, settings, generation=key.split("/")[0])
        warm = {k: rec.get(k, getattr(start, k)) for k in fields}
        res = fit_rows(rows, key, rows[0].stack, settings, rounds=3, time_grid=dict(fields), memory_grid={},
                       restarts=1, warm=warm)
        values = {k: res.values.get(k, getattr(start, k)) for k in fields}
        out["records"][key]["values"] = {**kept, **values}
        print(f"{key}: {len(rows)} rows, median |err| {res.throughput_error_after:.2%}, "
              + ", ".join(f"{k}={v:g}" for k, v in values.items())
              + f" ({time.process_time() - began:.0f} CPU s)", flush=True)
    return out
