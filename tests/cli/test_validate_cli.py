"""`meshplan validate` through the real entry point, on the shared CSV and a hand-made one."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.data.published import runs_csv

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
HEADER = ["id", "source", "model", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
          "ffn_hidden_size", "vocab_size", "seq_len", "moe_num_experts", "moe_top_k",
          "moe_ffn_hidden_size", "gpu", "num_gpus", "gpus_per_node", "global_batch_size",
          "micro_batch_size", "tp", "pp", "dp", "cp", "ep", "vpp", "zero", "sequence_parallel",
          "recompute", "precision", "measured_tflops_per_gpu", "flops_basis", "measured_mfu",
          "measured_tokens_per_s_per_gpu", "measured_step_time_s", "measured_peak_mem_gib",
          "reliability", "notes"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=HEADER)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in HEADER})
    return path


GOOD = dict(id="1", source="hand", model="GPT 1.7B", num_layers="24", hidden_size="2304", num_heads="24",
            vocab_size="51200", seq_len="2048", gpu="a100-80gb", num_gpus="32", gpus_per_node="8",
            global_batch_size="512", micro_batch_size="16", tp="1", pp="1", recompute="full",
            precision="fp16", measured_tflops_per_gpu="137", flops_basis="hardware")


def test_tiny_csv(tmp_path):
    rows = [
        GOOD,
        {**GOOD, "id": "2", "tp": "5", "num_gpus": "40"},  # 24 heads not divisible by 5
        {**GOOD, "id": "3", "measured_tflops_per_gpu": "", "flops_basis": "", "measured_step_time_s": "2.0",
         "measured_peak_mem_gib": "30"},
        {**GOOD, "id": "4", "measured_tflops_per_gpu": "", "flops_basis": "", "recompute": "none", "notes": "OOM at startup"},
    ]
    r = run("validate", "--runs", str(write(tmp_path / "runs.csv", rows)), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["rows"] == 3 and d["summary"]["skipped"] == 1
    assert "not divisible by tp=5" in d["skipped"][0]["reason"]
    by_id = {x["row_id"]: x for x in d["rows"]}
    assert by_id["1"]["metric"] == "tflops_per_gpu" and by_id["1"]["predicted"] > 0
    assert by_id["3"]["metric"] == "step_time_s" and by_id["3"]["memory_error"] is not None
    assert by_id["4"]["oom"] is True and by_id["4"]["fits"] is False
    assert d["summary"]["oom_predicted_not_fitting"] == 1
    # the error is predicted/measured - 1 of the row's metric
    one = by_id["1"]
    assert one["error"] == pytest.approx(one["predicted"] / one["measured"] - 1)


def test_bad_runs_files(tmp_path):
    r = run("validate", "--runs", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and r.stderr.startswith("error: ")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = run("validate", "--runs", str(bad))
    assert r.returncode == 2 and "missing column" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_shipped_runs_meet_targets():
    """The published runs ship with the package: by name, and by default (from any directory)."""
    r = run("validate", "--runs", "calibration", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["throughput_rows"] >= 100 and s["memory_rows"] >= 30
    assert s["throughput_median_abs_error"] <= 0.10
    assert s["memory_median_abs_error"] <= 0.10
    t = run("validate")
    assert t.returncode == 0 and "median" in t.stdout and "Rows not estimated" in t.stdout
    assert json.loads(run("validate", "--json").stdout)["summary"] == s


def test_shipped_megatron_bridge_set_is_found_by_name():
    r = run("validate", "--runs", "megatron-bridge", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["rows"] + s["skipped"] >= 250


@pytest.mark.parametrize("arg, message", [("no-such-set", "no such file, nor a shipped set (calibration"),
                                          (".", "is a directory")])
def test_runs_that_are_neither_a_file_nor_a_shipped_set(arg, message):
    r = run("validate", "--runs", arg)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


BRIDGE = runs_csv("megatron-bridge")


def test_bridge_rows_build_where_their_preset_exists():
    """Every row whose model resolves to a preset of this build is estimated (one row with an
    inconsistent alternate configuration aside, and the rows whose Megatron-Bridge preset sets what
    meshplan cannot express: bridge_recipes.csv not_expressed); the others are listed as 'no preset X'."""
    from meshplan.spec.aliases import resolve_alias
    from meshplan.spec.presets import model_names

    r = run("validate", "--runs", str(BRIDGE), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    with BRIDGE.open(newline="") as fh:
        rows = {row["id"]: row for row in csv.DictReader(fh)}
    assert d["summary"]["rows"] + d["summary"]["skipped"] == len(rows) == 275
    have = {i for i, row in rows.items() if resolve_alias(row["model"]).preset in model_names()}
    built = {x["row_id"] for x in d["rows"]}
    unexpressed = {s["row_id"] for s in d["skipped"] if "which meshplan cannot express" in s["reason"]}
    assert unexpressed == {"302", "303"}  # Nemotron 3 Ultra GB300 / GB200: expert-MLP fine-grained offload
    assert built <= have and len(built) >= len(have - unexpressed) - 1
    for s in d["skipped"]:
        assert s["reason"]
        if s["row_id"] not in have:
            assert s["reason"].startswith("no preset ")
    for x in d["rows"]:
        assert x["predicted"] > 0 and any(a.startswith("model: preset") for a in x["assumed"])
