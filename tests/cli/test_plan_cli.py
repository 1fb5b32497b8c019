"""`meshplan plan` and `meshplan explain` through the real entry point."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_plan_json_out_plot_and_explain(tmp_path):
    out, png = tmp_path / "plan.json", tmp_path / "frontier.png"
    r = run("plan", "--model", "llama2-7b", "--cluster", "dgx-h100", "--seq-len", "2048",
            "--global-batch", "64", "--json", "--out", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    front = data["frontier"]
    assert data["num_gpus"] == 8 and len(front) >= 2
    times = [p["step_time_s"] for p in front]
    mems = [p["peak_memory_gib"] for p in front]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)  # a Pareto staircase
    rec, fastest = data["recommended"], data["fastest_that_fits"]
    assert front[fastest]["fits"] and not any(p["fits"] for p in front[:fastest])
    # the recommendation is robust to the model's error: within its band of the fastest that fits
    # (the error of the model's ratio between the two plans, search/robust.py)
    band = data["robust"]["band"]
    assert front[rec]["fits"] and front[rec]["step_time_s"] <= front[fastest]["step_time_s"] * (1 + band) * (1 + 1e-12)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    job = json.loads(out.read_text())
    assert job["plan"]["micro_batch"] == front[rec]["plan_detail"]["micro_batch"]
    e = run("explain", str(out), "--json")
    assert e.returncode == 0, e.stderr
    ex = json.loads(e.stdout)
    assert abs(ex["step_time_s"] - front[rec]["step_time_s"]) < 1e-9 * front[rec]["step_time_s"]
    assert len(ex["stages"]) == job["plan"]["dims"]["pp"]
    t = run("explain", str(out))
    assert t.returncode == 0 and "Per pipeline rank" in t.stdout


def test_plan_table_and_pick(tmp_path):
    out = tmp_path / "p1.json"
    r = run("plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--nodes", "1", "--seq-len", "2048",
            "--global-batch", "64", "--out", str(out), "--pick", "1", "--top", "5")
    assert r.returncode == 0, r.stderr
    assert "Pareto frontier" in r.stdout and "*best" in r.stdout and "frontier point 1" in r.stdout
    assert json.loads(out.read_text())["meshplan_plan_version"] == 3


def test_plan_several_gpu_counts_and_cpu_cluster():
    r = run("plan", "--model", "toy-llama", "--cluster", "cpu", "--gpus", "2-8", "--seq-len", "128",
            "--global-batch", "16", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [c["num_gpus"] for c in data["counts"]] == [2, 4, 8]
    rows = data["scaling"]
    assert all(row["gpu_hours_per_billion_tokens"] > 0 for row in rows if row["plan"])
    assert any(row["on_frontier"] for row in rows)
    one = run("plan", "--model", "toy-llama", "--cluster", "cpu", "--gpus", "4", "--seq-len", "128",
              "--global-batch", "16")
    assert one.returncode == 0, one.stderr
    assert "4 x cpu" in one.stdout


def test_nothing_fits_is_one_line_exit_2():
    r = run("plan", "--model", "llama3-70b", "--gpu", "a100-40gb", "--nodes", "1", "--seq-len", "8192",
            "--global-batch", "8")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no plan fits")
    assert "leanest plan needs" in lines[0] and "more GPUs" in lines[0]


def test_bad_input_exit_2():
    for args in (["--gpus", "abc"], ["--gpus", "0"], ["--memory-gib", "-1"], ["--pick", "999", "--out", "x.json"]):
        r = run("plan", "--model", "toy-llama", "--cluster", "cpu", "--seq-len", "128",
                "--global-batch", "16", *(["--gpus", "4"] if "--gpus" not in args else []), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    r = run("explain", "/nonexistent/plan.json")
    assert r.returncode == 2 and "no such plan file" in r.stderr
