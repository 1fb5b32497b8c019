"""The attention kernel is a stack property and its efficiency a literature table per (GPU
generation, kernel) (issue 14, item 4): calibration_for starts a (generation, stack) without a
fitted record from the table; a fitted record's value wins."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from meshplan.cost.attention_kernels import KERNELS_FILE, kernel_efficiency, kernel_names
from meshplan.cost.calibration import (Calibration, calibration_for, fitted_records, gpu_generation, record_key,
                                       stack_records)
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import gpu_preset


def table() -> dict:
    return json.loads(resources.files("meshplan.spec").joinpath(KERNELS_FILE).read_text())


@pytest.mark.parametrize(("generation", "kernel", "efficiency"), [
    ("ampere", "fa2", 0.55),     # Dao 2023 Sec. 4.1: 50-73% of A100, the default's figure
    ("hopper", "fa2", 0.42),     # Shah et al. 2024 Figs. 5-6: the form's limit of FA2's H100 curve
    ("hopper", "fa1-triton", 0.21),  # FA2 ~2x FlashAttention (Dao 2023): half of Hopper fa2
    ("hopper", "cudnn", 0.6),    # FA3-class: 0.35 x ~1.7 forward + backward
    ("blackwell", "cudnn", 0.44),  # FA4 71% x 0.8 / 1.3 (FA4 up to 1.3x cuDNN 9.13)
])
def test_table_lookup_golden(generation, kernel, efficiency):
    entry = kernel_efficiency(generation, kernel)
    assert entry is not None and entry.attention_efficiency == pytest.approx(efficiency)
    assert entry.source


def test_fa2_on_hopper_is_slower_than_cudnn_and_than_fa2_on_ampere():
    """The ordering the papers give: FA2 uses neither wgmma nor TMA on H100."""
    fa2, cudnn = kernel_efficiency("hopper", "fa2"), kernel_efficiency("hopper", "cudnn")
    assert fa2.attention_efficiency < cudnn.attention_efficiency
    assert fa2.attention_efficiency < kernel_efficiency("ampere", "fa2").attention_efficiency


def test_blackwell_ultra_borrows_blackwells_entries():
    entry = kernel_efficiency("blackwell-ultra", "cudnn")
    assert entry.generation == "blackwell"
    assert entry.attention_efficiency == kernel_efficiency("blackwell", "cudnn").attention_efficiency


def test_a_pair_the_literature_does_not_cover_has_no_entry():
    assert kernel_efficiency("volta", "fa2") is None      # FlashAttention-2 needs Ampere or newer
    assert kernel_efficiency("blackwell", "fa3") is None  # FlashAttention-3 is Hopper-only


def test_every_entry_names_a_known_kernel_a_source_and_an_efficiency_in_0_1():
    for generation, entries in table()["efficiency"].items():
        for kernel, entry in entries.items():
            assert kernel in kernel_names(), (generation, kernel)
            resolved = kernel_efficiency(generation, kernel)
            assert entry["source"] and 0 < resolved.attention_efficiency <= 1


def test_every_stack_names_its_kernel():
    kernels = {s: rec.values["attention_kernel"] for s, rec in stack_records().items()}
    assert kernels == {"meshplan": "fa2", "megatron": "cudnn", "torchtitan": "fa2", "deepspeed": "fa2"}


@pytest.mark.parametrize(("gpu", "stack", "efficiency"), [
    ("h100-sxm", "torchtitan", 0.42),
    ("h100-sxm", "meshplan", 0.42),
    ("h200", "deepspeed", 0.42),
    ("b200", "torchtitan", 0.35),
    ("a100-80gb", "torchtitan", 0.55),  # borrows ampere/megatron's hardware fields, FA2's efficiency
])
def test_a_stack_without_a_record_gets_the_tables_value(gpu, stack, efficiency):
    spec = gpu_preset(gpu)
    assert record_key(gpu_generation(spec), stack) not in fitted_records()
    calib = calibration_for(spec, stack)
    assert calib.attention_efficiency == pytest.approx(efficiency)
    assert "attention kernel table" in calib.source


GPU_OF_GENERATION = {"hopper": "h100-sxm", "blackwell": "b200", "blackwell-ultra": "b300", "ampere": "a100-80gb"}


def test_a_fitted_record_overrides_the_table():
    # Whichever megatron records the last refit gave an attention efficiency (a refit may leave it
    # at its start and drop it), the record's value is used whatever the kernel table says.
    keyed = {key: rec.values["attention_efficiency"] for key, rec in fitted_records().items()
             if key.endswith("/megatron") and "attention_efficiency" in rec.values
             and key.split("/")[0] in GPU_OF_GENERATION}
    assert keyed, "no fitted megatron record carries attention_efficiency"
    for key, fitted in keyed.items():
        calib = calibration_for(gpu_preset(GPU_OF_GENERATION[key.split("/")[0]]), "megatron")
        assert calib.attention_efficiency == fitted, key
        assert f"attention_efficiency {fitted:g} fitted ({key}) over the table's" in calib.source, key


def test_a_generation_without_an_entry_keeps_the_default():
    assert calibration_for(gpu_preset("mi300x"), "torchtitan").attention_efficiency == \
        Calibration().attention_efficiency


def test_an_unknown_kernel_is_one_clear_error():
    with pytest.raises(MeshplanError, match="unknown attention kernel 'fa9'; known: fa2, fa3, fa4, fa1-triton, cudnn"):
        Calibration(attention_kernel="fa9")
    with pytest.raises(MeshplanError, match="unknown attention kernel"):
        kernel_efficiency("hopper", "flash")


@pytest.mark.parametrize("gpu", ["cpu", "h100-sxm"])
def test_a_profiles_measured_attention_efficiency_wins_over_the_table(gpu):
    """The profiler's fitted efficiency replaces the starting value (on CPU, whose meshplan stack
    has a record and no table entry, and on a GPU where the table gave the start)."""
    from meshplan.calib.hwcalib import calibration_from_profile
    from meshplan.spec.training import Precision

    golden = Path(__file__).parent / "data" / "hwprofile_small.json"
    base = calibration_for(gpu_preset(gpu), "meshplan")
    calib, fitted = calibration_from_profile(golden, Precision.FP32, base)
    measured = next(f.value for f in fitted if f.field == "attention_efficiency")
    assert calib.attention_efficiency == pytest.approx(measured) != base.attention_efficiency
    assert calib.attention_kernel == base.attention_kernel
