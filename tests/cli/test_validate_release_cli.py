"""`meshplan validate` reads each row's stack release (spec/stack_version.py), through the real
entry point: the same plan on two Megatron-Bridge containers gets two estimates where the newer
release's presets change how the MoE layer runs, and one where they do not (a dense model, a
release the data does not name)."""

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


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_two_containers_of_one_plan(tmp_path):
    moe = _shipped("293")    # Qwen3-30B-A3B, 8 GB200, fp8, ep8 mb4 (container 26.08)
    dense = _shipped("353")  # Llama 3 70B, 64 GB200, fp8, tp2 pp4 (the 8B presets run full-iteration graphs)
    assert moe["model"].lower().startswith("qwen3") and "llama" in dense["model"].lower()
    rows = []
    for base, tag in ((moe, "moe"), (dense, "dense")):
        for i, (source, framework) in enumerate((("Megatron-Bridge 26.04", "megatron-core"),
                                                 ("Megatron-Bridge 26.06.01", "megatron-core"),
                                                 ("Megatron-Bridge", "megatron-bridge 26.06"),  # the release as framework
                                                 ("Megatron-Bridge 27.02", "megatron-core"))):  # not in the data
            rows.append({**base, "id": f"{tag}{i}", "source": source, "framework": framework})
    r = run("validate", "--runs", str(_write(tmp_path / "runs.csv", rows)), "--json")
    assert r.returncode == 0, r.stderr
    pred = {x["row_id"]: x["predicted"] for x in json.loads(r.stdout)["rows"]}
    assumed = {x["row_id"]: x["assumed"] for x in json.loads(r.stdout)["rows"]}
    # MoE: the 26.06 presets (full-iteration graph, fused grouped MLP, FP8 attention) run faster
    assert pred["moe1"] > 1.05 * pred["moe0"]
    assert pred["moe2"] == pred["moe1"]      # 'megatron-bridge 26.06' names the same release
    assert pred["moe3"] == pred["moe0"]      # an unnamed release: the stack's defaults, no error
    assert any("release: megatron 26.06" in a and "cuda_graph_full_iteration" in a for a in assumed["moe1"])
    assert not any(a.startswith("release:") for a in assumed["moe3"])
    # dense: no preset of these releases changes how it runs
    assert pred["dense0"] == pred["dense1"] == pred["dense2"] == pred["dense3"]
