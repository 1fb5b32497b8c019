"""Megatron-Bridge presets and partial activation offload through the real entry point."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from meshplan.calib.validate import REQUIRED_COLUMNS

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--seq-len", "8192", "--global-batch", "32"]
# runs_megatron_bridge.csv row 400: preset LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2 (FSDP,
# cpu_offloading_num_layers=20)
ROW = dict(id="400", source="Megatron-Bridge 26.04", model="LLAMA3_70B", seq_len="8192", gpu="gb300",
           num_gpus="64", gpus_per_node="8", global_batch_size="256", micro_batch_size="2", tp="1", pp="1",
           dp="64", cp="1", ep="1", vpp="1", zero="3", precision="fp8", measured_tokens_per_s_per_gpu="3000",
           framework="megatron-core")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_validate_says_how_many_rows_took_a_preset(tmp_path):
    path = tmp_path / "runs.csv"
    header = [*REQUIRED_COLUMNS, "framework"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerow({k: ROW.get(k, "") for k in header})
        w.writerow({k: {**ROW, "id": "401", "micro_batch_size": "1"}.get(k, "") for k in header})
    r = run("validate", "--runs", str(path))
    assert r.returncode == 0, r.stderr
    assert "1 rows took memory settings" in r.stdout
    d = json.loads(run("validate", "--runs", str(path), "--json").stdout)
    assert d["summary"]["preset_rows"] == 1
    (taken,) = [row for row in d["rows"] if row["preset"]]
    assert taken["plan"].endswith("offload=activations:20")
    assert any("cpu_offloading_num_layers=20" in a for a in taken["assumed"])


def test_estimate_offload_layers_flag():
    r = run("estimate", *JOB, "--zero", "3", "--recompute", "full", "--offload", "activations",
            "--offload-layers", "20", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["plan"].endswith("offload=activations:20") and "--offload-layers 20" in d["flags"]
    bad = run("estimate", *JOB, "--zero", "3", "--offload-layers", "20")
    assert bad.returncode == 2 and "needs offload 'activations'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
