"""The architecture, checked on the source (issue 12, item 3): spec/ imports nothing above it,
no two meshplan packages import each other (directly or round a loop), no module imports itself
back round a loop, and one fact has one definition (model FLOPs per token).

Every import statement counts, inside functions too (a lazy import hides a cycle from the
interpreter, not from the design); imports under ``if TYPE_CHECKING`` name types for annotations
only and never run, so they are no dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "meshplan"
SPEC_MAY_NOT_IMPORT = ("meshplan.cost", "meshplan.plan", "meshplan.search", "meshplan.calib")
LAYERS = {
    # unit: its layer; a unit imports only units of lower layers (README's layout, bottom up)
    "meshplan.errors": 0, "meshplan.numbers": 1, "meshplan.textfile": 1, "meshplan.shipped": 1,
    "meshplan.launch_env": 1,  # imports nothing of meshplan
    "meshplan.fsdp_policy": 1,  # imports nothing of meshplan
    "meshplan.ring_policy": 1,  # imports nothing of meshplan
    "meshplan.data": 2, "meshplan.jsonfile": 2,
    "meshplan.spec": 3,  # imports errors, numbers, textfile and jsonfile only
    "meshplan.plan": 4, "meshplan.hf_names": 4,
    "meshplan.cost": 5, "meshplan.ckpt_meta": 5,
    "meshplan.search": 6, "meshplan.calib": 6,
    "meshplan.export": 7,
    "meshplan.targets": 8,
    "meshplan.report": 9, "meshplan.runtime": 9,
    "meshplan.profile": 10,
    "meshplan.cli": 11, "meshplan.__main__": 12,
}


def module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = SRC) -> set[str]:
    """Absolute names of the meshplan modules (or packages) that ``path`` (under ``root``) imports."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports under ``if TYPE_CHECKING:`` name types for annotations only: they run never, so they
    # are no dependency (a spec helper typed by ModelSpec that ModelSpec itself calls is no loop).
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                 for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # ``from meshplan.x import y``: y may be a submodule
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def module_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        graph[name] = {m for m in imports_of(path) if m in files and m != name}
    return graph


def unit(module: str) -> str:
    """The layer a module belongs to: its package under meshplan (``meshplan.cost``), or the
    module itself for a top-level one (``meshplan.plan``)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state[nxt] == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state[nxt] == 0:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state[node] == 0:
            found = visit(node)
            if found:
                return found
    return None


def test_spec_imports_nothing_above_it():
    bad = [(m, dep) for m, deps in module_graph().items() if m.startswith("meshplan.spec")
           for dep in deps if dep.startswith(SPEC_MAY_NOT_IMPORT)]
    assert not bad, f"spec/ imports a layer above it: {bad}"


def test_every_import_points_down_the_layers():
    units = {unit(m) for m in module_graph()} - {PACKAGE}
    assert units <= set(LAYERS), f"place the new unit(s) in LAYERS: {sorted(units - set(LAYERS))}"
    upward = sorted({(unit(m), unit(d)) for m, deps in module_graph().items() for d in deps
                     if unit(m) != PACKAGE and unit(d) != PACKAGE and unit(d) != unit(m)
                     and LAYERS[unit(d)] >= LAYERS[unit(m)]})
    assert not upward, f"imports that point up (or sideways) the layers: {upward}"


def test_no_import_cycle_between_packages():
    layers: dict[str, set[str]] = defaultdict(set)
    for m, deps in module_graph().items():
        layers[unit(m)].update(unit(d) for d in deps if unit(d) != unit(m) and unit(d) != PACKAGE)
    assert find_cycle(dict(layers)) is None, f"packages import each other: {' -> '.join(find_cycle(dict(layers)))}"


def test_no_import_cycle_between_modules():
    graph = module_graph()
    # a package's __init__ re-exporting its modules is not a loop of the design
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, f"modules import each other: {' -> '.join(cycle)}"


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"a"}}, ["a", "a"]),
])
def test_find_cycle_finds_what_is_there(graph, expected):
    assert find_cycle(graph) == expected


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / PACKAGE / "spec"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from ..cost import step\n    from . import model\n")
    (pkg / "__init__.py").write_text("from .x import f\n")
    assert imports_of(pkg / "x.py", tmp_path) == {"meshplan.cost", "meshplan.cost.step", "meshplan.spec",
                                                  "meshplan.spec.model"}
    assert imports_of(pkg / "__init__.py", tmp_path) == {"meshplan.spec.x", "meshplan.spec.x.f"}


def test_model_flops_per_token_has_one_definition():
    """The MFU ``meshplan train`` logs and the MFU ``estimate`` predicts come from one function
    (cost.flops), not two formulas that drift apart (they differed by 12.5% on llama3-8b at 8k)."""
    defs = [module_name(p) for p in (SRC / PACKAGE).rglob("*.py")
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name == "model_flops_per_token"]
    assert defs == ["meshplan.cost.flops"]
    train = SRC / PACKAGE / "runtime" / "train.py"
    assert "meshplan.cost.flops" in imports_of(train)
