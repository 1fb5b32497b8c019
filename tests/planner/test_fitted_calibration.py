"""A training stack is a named calibration (issue 14, item 6): the stacks' mechanisms and the
values fitted per (GPU generation, stack) live as data with their source
(spec/presets/calibration_fitted.json), and calibration_for layers them in a documented order."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from meshplan.cost.attention_kernels import kernel_fields
from meshplan.cost.calibration import (FITTED_FILE, STACK_FIELDS, Calibration, calibration_for,
                                       fitted_records, gpu_generation, stack_records)
from meshplan.cost.calib_records import read_stack_records
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import gpu_preset
from meshplan.spec.frameworks import framework_defaults, framework_names
from meshplan.targets import Target


def raw_file() -> dict:
    return json.loads(resources.files("meshplan.spec").joinpath(FITTED_FILE).read_text())


def test_every_record_names_its_source_and_how_it_was_fitted():
    records = fitted_records()
    assert set(records) == set(raw_file()["records"])
    generations = set(raw_file()["generations"].values())
    for key, rec in records.items():
        generation, stack = key.split("/")
        assert generation in generations and stack in stack_records()
        assert rec.key == key and rec.source.strip() and rec.how.strip()
        assert rec.values, f"{key}: a record without values"


def test_every_target_is_a_stack_with_a_source_and_only_stack_fields():
    assert set(stack_records()) == {t.value for t in Target}
    for stack, rec in stack_records().items():
        assert rec.source.strip() and set(rec.values) <= set(STACK_FIELDS)


@pytest.mark.parametrize("name", framework_names())
def test_every_framework_maps_to_a_stack(name):
    assert framework_defaults(name).stack in stack_records()


@pytest.mark.parametrize("gpu,generation", [("v100-32gb", "volta"), ("a100-80gb", "ampere"),
                                            ("h100-sxm", "hopper"), ("h200", "hopper"),
                                            ("gb200", "blackwell"), ("b300", "blackwell-ultra"),
                                            ("gb300", "blackwell-ultra"), ("cpu", "cpu")])
def test_generation_of_a_gpu(gpu, generation):
    assert gpu_generation(gpu_preset(gpu)) == generation


@pytest.mark.parametrize("gpu,stack", [("a100-80gb", "megatron"), ("v100-32gb", "megatron"),
                                       ("h100-sxm", "megatron"), ("gb200", "megatron"), ("cpu", "meshplan")])
def test_a_pair_with_a_record_takes_its_values_over_the_stacks(gpu, stack):
    spec = gpu_preset(gpu)
    rec = raw_file()["records"][f"{gpu_generation(spec)}/{stack}"]
    calib = calibration_for(spec, stack)
    assert calib.source.startswith(rec["source"])
    stack_values = read_stack_records()[stack].values  # the file's, meshplan's with its launcher's
    for field, value in {**stack_values, **rec["values"]}.items():
        assert getattr(calib, field) == value, field
    # what neither sets is the default, or the stack's kernel's on this generation (the kernel
    # table is every pair's start: cost/stack_resolution.py)
    table = kernel_fields(gpu_generation(spec), stack_values.get("attention_kernel", Calibration().attention_kernel))
    start = Calibration().replace_fields(**table)
    untouched = set(Calibration().to_dict()) - set(rec["values"]) - {"source"} - set(stack_values)
    assert all(getattr(calib, f) == getattr(start, f) for f in untouched)


def test_a_pair_without_a_record_borrows_hardware_fields_but_keeps_its_stacks_mechanisms():
    spec = gpu_preset("a100-80gb")
    lender = raw_file()["records"]["ampere/megatron"]["values"]
    mine = raw_file()["stacks"]["torchtitan"]["values"]
    calib = calibration_for(spec, "torchtitan")
    assert calib.matmul_efficiency == lender["matmul_efficiency"]
    assert calib.dp_overlap == mine["dp_overlap"] != calibration_for(spec, "megatron").dp_overlap
    assert "ampere/megatron" in calib.source and "torchtitan" in calib.source


def test_the_default_stack_is_meshplans_runtime():
    spec = gpu_preset("h100-sxm")
    assert calibration_for(spec) == calibration_for(spec, "meshplan")
    assert calibration_for(spec).tp_overlap == 0.0  # DTensor TP: synchronous collectives


def test_only_the_listed_lenders_lend_their_hardware_fields():
    """The Hopper/Blackwell Megatron fits still absorb unmodelled fp8/MoE costs: not lent."""
    assert "hopper/megatron" in fitted_records() and "hopper/megatron" not in raw_file()["lenders"]
    mesh = calibration_for(gpu_preset("h100-sxm"), "meshplan")
    hopper = raw_file()["records"]["hopper/megatron"]["values"]
    # the hardware fields the Hopper fit moved that no transfer carries (not the GEMM's: below)
    borrowed = [f for f in ("intra_node_comm_efficiency", "inter_node_comm_efficiency", "comm_half_message_bytes",
                            "mamba_scan_efficiency", "fp8_matmul_factor", "moe_expert_gemm_s") if f in hopper]
    assert len(borrowed) >= 2
    for field in borrowed:
        assert getattr(mesh, field) == getattr(Calibration(), field) != hopper[field]
    assert "hopper/megatron" not in mesh.source  # its GEMM fields come from Ampere's (test_generation_transfer.py)
    assert calibration_for(gpu_preset("a100-80gb"), "meshplan").matmul_efficiency == \
        raw_file()["records"]["ampere/megatron"]["values"]["matmul_efficiency"]


def test_a_generation_without_any_record_gets_defaults_and_the_stacks_mechanisms():
    calib = calibration_for(gpu_preset("mi300x"), "deepspeed")
    expected = Calibration().replace_fields(**raw_file()["stacks"]["deepspeed"]["values"])
    assert calib.replace_fields(source="x") == expected.replace_fields(source="x")


def test_an_unknown_stack_is_one_clear_error():
    with pytest.raises(MeshplanError, match="unknown stack 'nemo'"):
        calibration_for(gpu_preset("h100-sxm"), "nemo")


def test_megatron_overlaps_tp_as_it_overlaps_cp():
    """Consistent across axes (issue 15 item 1): a stack that overlaps ring CP's passes with
    attention overlaps TP's collectives with its GEMMs too when it has the mechanism."""
    for gpu in ("h100-sxm", "gb200"):
        c = calibration_for(gpu_preset(gpu), "megatron")
        assert c.tp_overlap > 0 and c.cp_overlap > 0
    meshplan = calibration_for(gpu_preset("h100-sxm"), "meshplan")
    assert meshplan.tp_overlap == 0 and meshplan.cp_overlap == 0
