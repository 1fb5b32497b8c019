"""Fitted calibration values live as data with their source (spec/presets/calibration_fitted.json),
and calibration_for reads them (issue 12, item 3)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from meshplan.cost.calibration import FITTED_FILE, Calibration, calibration_for, fitted_records, gpu_family
from meshplan.spec.cluster import gpu_preset


def raw_file() -> dict:
    return json.loads(resources.files("meshplan.spec").joinpath(FITTED_FILE).read_text())


def test_every_record_names_its_source_and_how_it_was_fitted():
    records = fitted_records()
    assert set(records) == {k for k in raw_file() if not k.startswith("_")}
    for family, rec in records.items():
        assert rec.family == family and rec.source.strip() and rec.how.strip()
        assert rec.values, f"{family}: a record without values"


@pytest.mark.parametrize("gpu", ["a100-80gb", "a100-40gb", "v100-32gb", "cpu"])
def test_calibration_for_takes_the_files_values(gpu):
    spec = gpu_preset(gpu)
    rec = raw_file()[gpu_family(spec)]
    calib = calibration_for(spec)
    assert calib.source == rec["source"]
    for field, value in rec["values"].items():
        assert getattr(calib, field) == value
    untouched = set(Calibration().to_dict()) - set(rec["values"]) - {"source"}
    assert all(getattr(calib, f) == getattr(Calibration(), f) for f in untouched)


def test_a_family_without_a_record_gets_the_defaults():
    spec = gpu_preset("h100-sxm")
    assert gpu_family(spec) not in fitted_records()
    assert calibration_for(spec) == Calibration()
