"""The cluster file: the shipped commented example loads back, numbers written 25e9 are numbers,
and a missing, unknown or non-numeric field is named (issue 12, item 10)."""

from __future__ import annotations

import pytest
import yaml

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import ClusterSpec, example_cluster_yaml, load_cluster_file, system_preset


def write(tmp_path, text: str, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_example_loads_back(tmp_path):
    c = load_cluster_file(write(tmp_path, example_cluster_yaml()))
    assert (c.num_nodes, c.gpus_per_node, c.num_gpus) == (16, 8, 128)
    assert c.gpu.peak_bf16_flops == 989.4e12 and c.gpu.hbm_bandwidth_bytes_per_s == 3.35e12
    assert c.inter_node_bandwidth_bytes_per_s == 25e9 and c.intra_node_latency_s == 3e-6
    assert ClusterSpec.from_dict(c.to_dict()) == c


def test_example_is_commented_and_names_every_field():
    text = example_cluster_yaml()
    data = yaml.safe_load(text)
    fields = set(ClusterSpec.__dataclass_fields__) | {f"gpu.{k}" for k in data["gpu"]}
    for name in ("num_nodes", "gpus_per_node", "intra_node_bandwidth_bytes_per_s", "intra_node_latency_s",
                 "inter_node_bandwidth_bytes_per_s", "inter_node_latency_s", "gpu.memory_gib"):
        assert name in fields
    assert set(data) == set(ClusterSpec.__dataclass_fields__)
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 5


@pytest.mark.parametrize("written, value", [("25e9", 25e9), ("25.0e+9", 25e9), ("2.5E10", 25e9),
                                             ("25000000000", 25e9)])
def test_exponent_numbers_are_numbers(tmp_path, written, value):
    """PyYAML (YAML 1.1) reads 25e9 as the string '25e9'; the cluster file takes it as a number."""
    if written == "25e9":
        assert yaml.safe_load(f"x: {written}")["x"] == "25e9"  # the quirk this guards against
    c = load_cluster_file(write(tmp_path, f"system: dgx-h100\ninter_node_bandwidth_bytes_per_s: {written}\n"))
    assert c.inter_node_bandwidth_bytes_per_s == value
    assert c.intra_node_bandwidth_bytes_per_s == system_preset("dgx-h100").intra_node_bandwidth_bytes_per_s


def test_integer_fields_take_text_integers(tmp_path):
    c = load_cluster_file(write(tmp_path, "system: dgx-h100\nnum_nodes: '4'\n"))
    assert c.num_nodes == 4


@pytest.mark.parametrize("text, message", [
    ("name: x\ngpu: h100-sxm\ngpus_per_node: 8\nintra_node_bandwidth_bytes_per_s: 450e9\n"
     "intra_node_latency_s: 3e-6\ninter_node_bandwidth_bytes_per_s: 25e9\n",
     "cluster is missing field(s): inter_node_latency_s"),
    ("system: dgx-h100\ninter_node_bandwidth: 25e9\n", "unknown cluster field(s): inter_node_bandwidth"),
    ("system: dgx-h100\ngpu: {name: g, peak_bf16_flops: 1e15}\n", "gpu is missing field(s): peak_fp16_flops"),
    ("system: dgx-h100\ngpu: {name: g, memory: 80}\n", "unknown gpu field(s): memory"),
    ("system: dgx-h100\ninter_node_latency_s: soon\n", "inter_node_latency_s must be a number, got 'soon'"),
    ("system: dgx-h100\ninter_node_bandwidth_bytes_per_s: .inf\n", "must be a finite number"),
    ("system: dgx-h100\nnum_nodes: 2.5\n", "num_nodes must be a positive integer"),
    ("system: dgx-h100\nnum_nodes: two\n", "num_nodes must be a number, got 'two'"),
])
def test_bad_fields_are_named(tmp_path, text, message):
    with pytest.raises(MeshplanError) as err:
        load_cluster_file(write(tmp_path, text))
    assert message in str(err.value) and "\n" not in str(err.value)
