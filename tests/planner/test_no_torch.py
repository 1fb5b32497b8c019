"""The planner must import and run with torch unimportable."""

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

BLOCK_TORCH = textwrap.dedent(
    """
    import sys, importlib.abc
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")
    sys.meta_path.insert(0, _Block())
    """
)


def test_planner_imports_without_torch():
    code = BLOCK_TORCH + textwrap.dedent(
        """
        import importlib, pkgutil, meshplan
        skip = ("meshplan.runtime", "meshplan.profile.")
        for m in pkgutil.walk_packages(meshplan.__path__, "meshplan."):
            if m.name.startswith(skip) or m.name == "meshplan.profile":
                continue
            importlib.import_module(m.name)
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_cli_runs_without_torch():
    code = BLOCK_TORCH + textwrap.dedent(
        """
        sys.argv = ["meshplan", "models", "--json"]
        from meshplan.cli.main import main
        try:
            main()
        except SystemExit as e:
            assert e.code in (0, None), e.code
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "llama3-70b" in out.stdout
