"""`meshplan validate` compares each row's peak memory with the prediction of what it measured
(the `memory_basis` column), through the real entry point."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.calib.validate import REQUIRED_COLUMNS

SRC = Path(__file__).resolve().parents[2] / "src"
ROW = dict(id="b1", source="BLOOM tr11 notes", model="", num_layers="24", hidden_size="2048", num_heads="16",
           vocab_size="50257", seq_len="2048", gpu="a100-80gb", num_gpus="16", gpus_per_node="8",
           global_batch_size="512", micro_batch_size="2", tp="2", pp="2", dp="4", zero="1", recompute="full",
           precision="fp16", measured_tflops_per_gpu="120", flops_basis="hardware",
           measured_peak_mem_gib="20", framework="megatron-deepspeed")


def validate(path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", "validate", "--runs", str(path), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)


def write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*dict.fromkeys([*REQUIRED_COLUMNS, *ROW]), "memory_basis"], restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def test_device_row_is_compared_with_the_device_total(tmp_path):
    r = validate(write(tmp_path / "runs.csv", [{**ROW, "memory_basis": "device"},
                                               {**ROW, "id": "b2", "memory_basis": "reserved"}]))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {row["row_id"]: row for row in out["rows"]}
    assert rows["b1"]["memory_basis"] == "device" and rows["b2"]["memory_basis"] == "reserved"
    # same plan: the device total is the reserved peak + megatron-deepspeed's eager CUDA context
    # (0.62 GiB) + NCCL's buffers of its tp, pp and dp communicators (3 x 16 x 2 x 4 MiB)
    gap = rows["b1"]["predicted_memory_gib"] - rows["b2"]["predicted_memory_gib"]
    assert gap == pytest.approx(0.62 + 0.375)
    assert rows["b1"]["memory_error"] == pytest.approx(rows["b1"]["predicted_memory_gib"] / 20.0 - 1.0)
    assert out["summary"]["memory_rows_by_basis"] == {"device": 1, "reserved": 1}


def test_unknown_basis_is_one_clear_line(tmp_path):
    r = validate(write(tmp_path / "runs.csv", [{**ROW, "memory_basis": "nvidia-smi"}]))
    assert r.returncode == 2
    assert "memory_basis" in r.stderr and "allocated, reserved, device" in r.stderr
    assert "Traceback" not in r.stderr


def test_estimate_shows_the_three_memory_figures():
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    args = [sys.executable, "-m", "meshplan", "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
            "--tp", "2", "--seq-len", "4096", "--global-batch", "64"]
    table = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert table.returncode == 0, table.stderr
    for line in ("peak memory reserved", "peak memory allocated", "peak on the device (+ CUDA context, NCCL)"):
        assert line in table.stdout
    d = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, env=env, timeout=300).stdout)
    assert d["peak_allocated_gib"] < d["peak_reserved_gib"] < d["peak_device_gib"]
