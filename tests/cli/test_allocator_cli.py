"""`meshplan validate` through the real entry point: a published Llama 3.1 405B FP8 GB200 plan
(row 321) fits under the expandable-segments allocator its launcher sets; the same row read as an
older, unnamed container (no release: the stack's defaults, the default allocator, Megatron-Core's
unfused loss) is estimated over the GPU; the reserved peak it logs is the same either way."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from meshplan.data.published import runs_csv

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def _shipped(row_id: str) -> dict[str, str]:
    with open(runs_csv("megatron-bridge"), newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == row_id)


def test_the_launchers_allocator_decides_fits(tmp_path):
    named = _shipped("321")  # Megatron-Bridge 26.06
    unnamed = {**named, "id": "321-old", "source": "Megatron-Bridge (container not stated)"}
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(named))
        w.writeheader()
        w.writerows([named, unnamed])
    r = run("validate", "--runs", str(path), "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["row_id"]: row for row in json.loads(r.stdout)["rows"]}
    a, b = rows["321"], rows["321-old"]
    assert any("allocator_expandable_segments=True" in n for n in a["assumed"])
    assert not any("allocator_expandable_segments" in n for n in b["assumed"])
    assert a["fits"] is True and b["fits"] is False
    # the heaviest rank of the 16-stage pipeline holds no logits: the reserved peak is the same,
    # above the GPU's 173.2 GiB; what fits the named row is the allocator giving its reserve back
    assert a["predicted_memory_gib"] == b["predicted_memory_gib"] > 173.2
