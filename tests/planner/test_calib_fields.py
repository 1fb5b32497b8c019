"""Calibration is the union of its field groups (cost/calib_fields/), in a fixed order."""

from dataclasses import FrozenInstanceError, fields

import pytest

from meshplan.cost.calib_fields import (CommFields, ComputeFields, LongContextFields, MechanismFields, MemoryFields,
                                        MoEFields, PrecisionFields)
from meshplan.cost.calibration import Calibration
from meshplan.errors import MeshplanError

GROUPS = (ComputeFields, PrecisionFields, LongContextFields, MoEFields, CommFields, MemoryFields, MechanismFields)


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def test_fields_keep_the_group_order() -> None:
    # asdict / to_dict and the written calibration JSON follow this order.
    expected = ["source"] + [name for group in GROUPS for name in _names(group)]
    assert _names(Calibration) == expected
    assert _names(Calibration)[:3] == ["source", "matmul_efficiency", "matmul_half_dim"]
    assert _names(Calibration)[-1] == "moe_fused_grouped_mlp"


def test_no_field_in_two_groups_and_none_outside_them() -> None:
    names = [name for group in GROUPS for name in _names(group)]
    assert len(names) == len(set(names))
    assert set(_names(Calibration)) - set(names) == {"source"}


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_each_group_is_frozen_and_keyword_only(group: type) -> None:
    instance = group()
    with pytest.raises(FrozenInstanceError):
        setattr(instance, _names(group)[0], 0)
    with pytest.raises(TypeError):
        group(0)


def test_checks_still_run_on_every_group() -> None:
    with pytest.raises(MeshplanError, match="moe_routing_imbalance"):
        Calibration(moe_routing_imbalance=0.5)
    with pytest.raises(MeshplanError, match="tp_overlap"):
        Calibration(tp_overlap=1.5)
    assert Calibration.from_dict(Calibration(fp8_param_gather=True).to_dict()).fp8_param_gather is True
