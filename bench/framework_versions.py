"""Which framework versions the exports are checked against (prints a table; not a test).

    PYTHONPATH=src python bench/framework_versions.py [--json]

For each framework: the version pinned in pyproject's ``frameworks`` extra, the version installed
here (None when absent: then tests/frameworks/ checks names against the vendored lists only),
whether it imports, and what reads the exports in tests/frameworks/.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import re
import sys
import tomllib
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
# distribution -> (module imported, what parses the exports)
CHECKERS = {
    "torchtitan": ("torchtitan.config", "ConfigManager().parse_args"),
    "triton": ("triton", "imported by torchtitan's model registries"),
    "deepspeed": ("deepspeed.runtime.config", "DeepSpeedConfig"),
    "megatron-core": ("megatron.core.transformer.transformer_config", "TransformerConfig"),
}


def pinned() -> dict[str, str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["frameworks"]
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", req).groups() for req in extra)


def installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure means the framework cannot be checked here
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for dist, version in pinned().items():
        module, reader = CHECKERS.get(dist, (dist, ""))
        have = installed(dist)
        rows.append({"framework": dist, "pinned": version, "installed": have,
                     "imports": have is not None and imports(module), "reader": reader})
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    t = Table(title="Frameworks the exports are checked against")
    for col in ("framework", "pinned", "installed", "imports", "reader"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["framework"], r["pinned"], str(r["installed"]), "yes" if r["imports"] else "no", r["reader"])
    Console().print(t)


if __name__ == "__main__":
    main()
