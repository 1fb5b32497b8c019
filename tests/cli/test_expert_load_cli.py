"""`--expert-skew`, `--expert-load`, `--expert-placement` and `--expert-replicas` through the real
entry point: the answers change with the load, bad inputs are one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
QWEN = ["--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--nodes", "2", "--seq-len", "4096", "--global-batch", "64"]
PLAN = ["--dp", "16", "--zero", "1", "--ep", "8"]
HEADER = {"format": "meshplan-expert-load", "version": 1, "num_experts": 128, "top_k": 8, "moe_layers": 2}


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def one_line_error(r: subprocess.CompletedProcess, fragment: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().startswith("error:") and fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def estimate(*extra: str) -> dict:
    r = run("estimate", *QWEN, *PLAN, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def write_log(path: Path, rows: list[list[int]]) -> Path:
    path.write_text(json.dumps(HEADER) + "\n" + "".join(
        json.dumps({"step": i + 1, "counts": [row, row]}) + "\n" for i, row in enumerate(rows)))
    return path


def test_skew_changes_the_estimate_and_the_table_shows_where_placement_pays():
    even, hot = estimate("--expert-skew", "0"), estimate("--expert-skew", "1.2")
    assert hot["step_time_s"] > even["step_time_s"] == hot["uniform_routing_step_time_s"]
    assert hot["expert_load"]["load_factor"] > even["expert_load"]["load_factor"] == 1.0
    options = {(o["placement"], o["replicas"]): o for o in hot["expert_placements"]}
    assert options[("contiguous", 0)]["step_time_s"] == hot["step_time_s"]
    assert options[("balanced", 0)]["step_time_s"] < hot["step_time_s"]
    balanced = estimate("--expert-skew", "1.2", "--expert-placement", "balanced", "--expert-replicas", "1")
    assert balanced["step_time_s"] == options[("balanced", 1)]["step_time_s"]
    assert "ep8balr1" in balanced["plan"]
    r = run("estimate", *QWEN, *PLAN, "--expert-skew", "1.2")
    assert r.returncode == 0 and "Expert load (zipf s=1.2)" in r.stdout and "balanced" in r.stdout


def test_a_routing_log_file(tmp_path):
    uniform = write_log(tmp_path / "uniform.jsonl", [[10] * 128] * 3)
    skewed = write_log(tmp_path / "skewed.jsonl", [[500] * 16 + [10] * 112] * 3)  # ep rank 0's experts hot
    a, b = estimate("--expert-load", str(uniform)), estimate("--expert-load", str(skewed))
    assert a["expert_load"]["load_factor"] == 1.0
    assert b["step_time_s"] > a["step_time_s"]
    # 16 x 500 of 9120 copies on rank 0 of 8: 8000 / 1140
    assert b["expert_load"]["load_factor"] == pytest.approx(8000 / 1140)


def test_plan_searches_with_the_load_and_writes_it_to_the_job(tmp_path):
    out = tmp_path / "job.json"
    r = run("plan", *QWEN, "--expert-skew", "1.5", "--target", "megatron", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(out.read_text())
    assert job["training"]["expert_load"] == {"zipf_exponent": 1.5}
    # megatron places experts contiguously: the search kept to that
    assert job["plan"]["expert_placement"] == "contiguous" and job["plan"]["expert_replicas"] == 0
    again = run("estimate", "--plan", str(out), "--json")
    assert json.loads(again.stdout)["expert_load"]["load_factor"] >= 1.0


def test_bad_inputs_are_one_line_exit_2(tmp_path):
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-load", str(tmp_path / "nope.jsonl")), "no such expert-load log")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n{\"step\": 1, \"counts\": [[1, 2]]}\n")
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-load", str(bad)), "line 2")
    small = write_log(tmp_path / "small.jsonl", [[1, 2, 3, 4]])
    small.write_text(small.read_text().replace('"num_experts": 128', '"num_experts": 4'))
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-load", str(small)), "counts 4 experts, the model has 128")
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-skew", "-1"), "Zipf exponent")
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-skew", "1", "--expert-load", str(small)), "not both")
    one_line_error(run("estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096",
                       "--global-batch", "64", "--expert-skew", "1"), "has no experts")
    one_line_error(run("estimate", *QWEN, "--dp", "16", "--expert-placement", "balanced"), "need ep > 1")
    one_line_error(run("estimate", *QWEN, *PLAN, "--expert-replicas", "17"), "exceeds the 16 experts")
    one_line_error(run("train", "--plan", str(tmp_path / "none.json"), "--expert-load-log", str(tmp_path / "x")),
                   "no such plan file")
    from meshplan.plan import Job, Plan
    from meshplan.spec.cluster import resolve_cluster
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    dense = tmp_path / "dense.json"
    Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=16, global_batch=8, precision="fp32"),
        cluster=resolve_cluster("cpu", gpus=1), plan=Plan()).save(dense)
    one_line_error(run("train", "--plan", str(dense), "--expert-load-log", str(tmp_path / "r.jsonl")),
                   "toy-llama has no experts")
    one_line_error(run("train", "--plan", str(dense), "--expert-load-log", str(tmp_path / "no" / "r.jsonl")),
                   "--expert-load-log")
