"""Fuzz the hardware a command is told about: cluster files (YAML or JSON, long and short form)
and hardware profiles (profile --show, --cluster-profile); exit 0 or 2, one ``error:`` line,
never a traceback (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from _fuzz_harness import (EC, FUZZ, ODD_JSON, PROFILE, assert_clean, dump_json, estimate_with_profile,
                           example_cluster_text, moe_on_cluster, mutated, write)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)


def test_the_good_cluster_and_profile_are_accepted(tmp_path):
    """The good forms the properties mutate: a refusal below is the mutation's."""
    assert assert_clean(moe_on_cluster(write(tmp_path, "c.yaml", example_cluster_text())))[0] == 0
    assert assert_clean(["profile", "--show", str(PROFILE)])[0] == 0
    assert assert_clean(estimate_with_profile(PROFILE))[0] == 0


# ---- cluster files (YAML or JSON) -----------------------------------------------------------------
@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), as_json=st.booleans(),
       extra=st.sampled_from([[], ["--nodes", "2"], ["--gpus-per-node", "4"]]))
def test_fuzz_cluster_file(pick, value, delete, as_json, extra, example_cluster, tmp_path_factory):
    d = mutated(example_cluster, pick, value, delete=delete)
    text = dump_json(d) if as_json else yaml.safe_dump(d)
    path = write(tmp_path_factory.mktemp("cl"), "cluster.json" if as_json else "cluster.yaml", text)
    assert_clean(moe_on_cluster(path) + extra)


@FUZZ
@given(system=st.sampled_from(["dgx-h100", "gb200-nvl72", "dgx-a100", "nope"]),
       field=st.sampled_from(["num_nodes", "gpus_per_node", "scale_up_domain_gpus", "nics_per_node",
                              "nic_bandwidth_bytes_per_s", "host_memory_gib_per_node", "clock_fraction",
                              "host_device_bandwidth_bytes_per_s", "gpu", "system"]),
       value=ODD_JSON)
def test_fuzz_cluster_short_form(system, field, value, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("cls"), "c.yaml", yaml.safe_dump({"system": system, field: value}))
    assert_clean(EC + ["--model", "gpt2", "--cluster", str(path)])


# ---- hardware profiles: profile --show and --cluster-profile ---------------------------------------
@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), show=st.booleans())
def test_fuzz_hardware_profile(pick, value, delete, show, tmp_path_factory):
    good = json.loads(PROFILE.read_text())
    path = write(tmp_path_factory.mktemp("prof"), "p.json", dump_json(mutated(good, pick, value, delete=delete)))
    assert_clean(["profile", "--show", str(path)] if show else estimate_with_profile(path))


@pytest.mark.parametrize("show", [True, False], ids=["show", "cluster-profile"])
def test_regression_profile_zero_shape(show, tmp_path):
    """An attention sample of head_dim 0 divided by zero (ZeroDivisionError in `profile --show`)."""
    d = json.loads(PROFILE.read_text())
    d["attention"][0]["head_dim"] = 0
    path = write(tmp_path, "p.json", dump_json(d))
    code, err = assert_clean(["profile", "--show", str(path)] if show else
                             EC + ["--model", "gpt2", "--cluster", "cpu", "--precision", "fp32", "--cluster-profile", str(path)])
    assert code == 2 and "attention[0].head_dim must be a positive integer, got 0" in err, err
