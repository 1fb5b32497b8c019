"""One fact, one place (STYLE.md): where a figure or a list must also appear somewhere else (an
example file, a data README), the copy is checked against the one that counts, so that correcting
the source breaks the test until the copy follows. (The model FLOPs per token and the import
layers: test_layers.py; the README's recommended plans: tests/cli/test_plan_flags_cli.py; the
framework versions: tests/_framework_pins.py.)"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

from meshplan.spec.cluster import example_cluster_yaml, gpu_preset, load_cluster_file, system_preset

SRC = Path(__file__).resolve().parents[2] / "src" / "meshplan"


def test_the_example_cluster_is_the_h100_preset_with_one_nic_per_gpu(tmp_path):
    """`meshplan clusters --example` writes the H100's datasheet figures out in full: they are the
    h100-sxm preset's, and the rest is dgx-h100's but for the one 200 Gb/s NIC per GPU it says."""
    path = tmp_path / "example.yaml"
    path.write_text(example_cluster_yaml())
    example = load_cluster_file(path)
    assert dataclasses.replace(example.gpu, name="h100-sxm") == gpu_preset("h100-sxm")
    dgx = system_preset("dgx-h100", num_nodes=example.num_nodes)
    own = {"name", "gpu", "inter_node_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s"}
    differs = {f.name for f in dataclasses.fields(example) if getattr(example, f.name) != getattr(dgx, f.name)}
    assert differs <= own, differs - own
    assert example.nic_bandwidth_bytes_per_s == 25e9  # 200 Gb/s


def test_the_runs_readme_lists_every_framework():
    """The runs CSV's `framework` column names an entry of frameworks.json; the data README lists
    them (blank: the entry 'unstated')."""
    frameworks = json.loads((SRC / "spec" / "presets" / "frameworks.json").read_text())["frameworks"]
    readme = (SRC / "data" / "README.md").read_text()
    listed = re.search(r"an entry of spec/presets/frameworks\.json \(([^)]*)\)", readme)
    assert listed, "the data README's framework row"
    assert listed.group(1).split(", ") == [f for f in frameworks if f != "unstated"]


def test_gib_has_one_definition():
    """Bytes per GiB is spec.cluster.GIB; no module defines its own."""
    defs = sorted(f"{p.relative_to(SRC)}:{node.lineno}" for p in SRC.rglob("*.py")
                  for node in ast.walk(ast.parse(p.read_text()))
                  if isinstance(node, ast.Assign) and any(getattr(t, "id", "").upper() in ("GIB", "BYTES_PER_GIB")
                                                          for t in node.targets))
    assert [d.split(":")[0] for d in defs] == ["spec/cluster.py"], defs


def test_shipped_files_are_read_through_one_loader():
    """A data file shipped in the package is found and read by meshplan/shipped.py only: no other
    module imports importlib.resources (session 8; calib/recipes.py and eleven more read their own)."""
    readers = sorted(f"{p.relative_to(SRC)}:{node.lineno}" for p in SRC.rglob("*.py")
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, (ast.Import, ast.ImportFrom))
                     and ("importlib.resources" in [a.name for a in node.names] if isinstance(node, ast.Import)
                          else node.module == "importlib" and "resources" in [a.name for a in node.names]
                          or node.module == "importlib.resources"))
    assert [r.split(":")[0] for r in readers] == ["shipped.py"], readers


def test_the_search_completes_its_plans_in_one_place():
    """Every frontier plan of the search is completed by one ``with_defaults`` call (session 7's
    review found five, one per kind of plan, and the uneven splits' own copy of its zero-recompute
    rule)."""
    tree = ast.parse((SRC / "search" / "planner.py").read_text())
    calls = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "with_defaults"]
    assert len(calls) == 1, calls
