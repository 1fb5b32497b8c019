"""`meshplan validate` on runs that name GPUs, models and stacks their own way, through the real
entry point: unknown names are skip reasons, a malformed file is exit code 2 with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "frameworks.csv"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_cli_skips_unknown_names_and_refuses_a_malformed_file(tmp_path):
    ok = _cli("validate", "--runs", str(FIXTURE), "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["summary"]["rows"] == 9 and out["summary"]["skipped"] == 3
    bad = tmp_path / "bad.csv"
    text = FIXTURE.read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace("H100-SXM5-80GB,8,", "H100-SXM5-80GB,eight,", 1)]) + "\n")
    assert ",eight," in bad.read_text()
    res = _cli("validate", "--runs", str(bad))
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert "num_gpus" in res.stderr
