"""Imports every command module (``cli/*_cmd.py``) so that each registers itself on the app."""

import importlib
import pkgutil

import meshplan.cli as _cli

for _mod in pkgutil.iter_modules(_cli.__path__):
    if _mod.name.endswith("_cmd"):
        importlib.import_module(f"meshplan.cli.{_mod.name}")
