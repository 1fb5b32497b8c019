"""What a new user met walking the README (session 10), one regression test per bug, through the
real entry point: a plan made for a stack gives the same step time in every command that reads its
file; the comparison of the recommended plan with itself reads as such; an HF config error names
its file once; help texts keep their '(the default)'; the GPU table shows every precision's rate."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = ("--model", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "16", "--seq-len", "4096", "--global-batch", "256")


def run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=cwd)


def _recommended(out: dict) -> dict:
    return out["frontier"][out["recommended"]]


def test_plan_target_is_written_and_every_reader_estimates_with_it(tmp_path):
    """`plan --target megatron --out` used to write a file without the target: estimate, explain and
    report of that file then gave meshplan's step time, not the one the search chose the plan on."""
    f = tmp_path / "meg.json"
    r = run("plan", *JOB, "--target", "megatron", "--out", str(f), "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    assert planned["target"] == "megatron"
    step_s = _recommended(planned)["step_time_s"]
    assert json.loads(f.read_text())["target"] == "megatron"

    est = run("estimate", "--plan", str(f), "--json")
    assert est.returncode == 0 and est.stderr.strip() == "", est.stderr
    est = json.loads(est.stdout)
    assert est["target"] == "megatron" and abs(est["step_time_s"] / step_s - 1) < 1e-9
    explain = json.loads(run("explain", str(f), "--json").stdout)
    assert explain["job"]["target"] == "megatron" and abs(explain["step_time_s"] / step_s - 1) < 1e-9
    # --target still wins, and it matters: meshplan's calibration gives another step time
    own = json.loads(run("estimate", "--plan", str(f), "--target", "meshplan", "--json").stdout)
    assert own["target"] == "meshplan" and abs(own["step_time_s"] / step_s - 1) > 1e-3
    rep = run("report", "--plan", str(f), "--out", str(tmp_path / "r.html"), "--json")
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["target"] == "megatron"


def test_plan_for_meshplan_writes_the_file_it_always_did(tmp_path):
    f = tmp_path / "own.json"
    assert run("plan", *JOB, "--out", str(f)).returncode == 0
    assert "target" not in json.loads(f.read_text())


def test_plan_flags_line_names_the_target():
    r = run("plan", *JOB, "--target", "megatron")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("as flags"))
    assert line.endswith("--target megatron")


def test_plan_file_with_an_unknown_target_is_one_line_exit_2(tmp_path):
    f = tmp_path / "own.json"
    assert run("plan", *JOB, "--out", str(f)).returncode == 0
    data = json.loads(f.read_text())
    for bad, says in (("megatorn", "is not one of"), (7, "must name a stack"), ("", "must name a stack")):
        g = tmp_path / "bad.json"
        g.write_text(json.dumps({**data, "target": bad}))
        r = run("estimate", "--plan", str(g))
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_report_of_the_recommended_plan_says_so(tmp_path):
    """The recommended plan compared with itself read 'recommended: ... (+0%) ...; yours gains on no
    term is smaller in the other plan'. This job's recommendation is not its nominally fastest plan
    (README: the robust choice), the case that printed it."""
    f = tmp_path / "plan.json"
    job = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "128", "--seq-len", "8192",
           "--global-batch", "1024")
    planned = run("plan", *job, "--out", str(f), "--json")
    assert planned.returncode == 0, planned.stderr
    out = json.loads(planned.stdout)
    assert out["recommended"] != out["fastest_that_fits"]  # else the case is not exercised
    r = run("report", "--plan", str(f), "--out", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert "yours is the recommended plan" in r.stderr
    assert "no term is smaller" not in r.stderr and "(+0%)" not in r.stderr


def test_hf_config_error_names_the_file_once(tmp_path):
    cfg = tmp_path / "gemma" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "some_new_arch", "hidden_size": 64}))
    r = run("estimate", "--model", str(cfg), "--gpu", "h100-sxm", "--nodes", "1", "--global-batch", "8")
    assert r.returncode == 2
    assert r.stderr.count(str(cfg)) == 1 and "some_new_arch" in r.stderr, r.stderr


def test_help_keeps_its_defaults_visible():
    """Rich read '[default]' in a help text as markup and dropped it ('delayed , tensorwise')."""
    text = re.sub(r"[│\s]+", " ", run("estimate", "--help").stdout)
    assert "delayed, the default" in text and "nvfp4, the default" in text
    assert "alltoall (the default)" in text
    assert " , " not in text


def test_gpu_table_shows_each_precision_and_blanks_the_missing():
    out = run("clusters").stdout
    cells = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in out.splitlines() if line.startswith("│ ") and line.count("│") == 9}
    # fp32, fp16, bf16, fp8, fp4, memory, HBM
    assert cells["v100-32gb"][:5] == ["15.7", "125", "", "", ""]  # fp16 only: its bf16 was shown as 0
    assert cells["a100-80gb"][:5] == ["19.5", "312", "312", "", ""]  # no fp8: was shown as 0
    assert cells["b200"][4] == "9000"
    gpus = {g["name"]: g for g in json.loads(run("clusters", "--json").stdout)["gpus"]}
    assert gpus["v100-32gb"]["peak_fp16_flops"] == 125e12


def test_dry_run_names_the_gpu_memory_as_estimate_does(tmp_path):
    f = tmp_path / "plan.json"
    assert run("plan", *JOB, "--out", str(f)).returncode == 0
    r = run("train", "--plan", str(f), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "of 79.2 GiB" in r.stdout and "reserved vs 79.2 GiB" in r.stdout


def test_resumed_run_progress_counts_the_steps_already_done():
    """A run resumed at step 20 of 40 ended on '20/40' (the bar counted this run's steps only)."""
    from meshplan.runtime.steplog import ProgressBar

    bar = ProgressBar(40, enabled=True, done=20)
    try:
        task = bar.bar.tasks[0]
        assert (task.completed, task.total) == (20, 40)
    finally:
        bar.close()


def test_replan_says_the_resume_command_needs_the_runs_data_and_lr(checkpoint, tmp_path):
    """replan printed `meshplan train --plan two.json --resume --checkpoint-dir ckpt` as the whole
    command: run as shown it resumed on random tokens at the default --lr (a checkpoint records
    neither)."""
    r = run("replan", "--checkpoint", str(checkpoint), "--gpus", "1", "--out", str(tmp_path / "one.json"))
    assert r.returncode == 0, r.stderr
    assert "--steps, --data and --lr of the run it resumes" in r.stdout


def test_export_then_import_gives_the_same_plan_and_step_time(tmp_path):
    """The importers wrote no target: a Megatron or torchtitan run read back was estimated for
    meshplan's runtime (llama3-8b on 16 H100, --target megatron: 2.69 s planned, 3.49 s imported)."""
    job = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2", "--seq-len", "8192",
           "--global-batch", "64")
    for target, importer in (("megatron", ("--from", "megatron")), ("torchtitan", ("--from", "torchtitan"))):
        planned, exported, back = (tmp_path / f"{target}{s}" for s in (".json", ".txt", "_back.json"))
        assert run("plan", *job, "--target", target, "--out", str(planned)).returncode == 0
        assert run("export", str(planned), "--to", target, "--out", str(exported)).returncode == 0
        arg = f"@{exported}" if target == "megatron" else str(exported)
        r = run("import", *importer, arg, "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
                "--out", str(back), "--json")
        assert r.returncode == 0, r.stderr
        a, b = json.loads(planned.read_text()), json.loads(back.read_text())
        assert b["target"] == target and a["training"] == b["training"]
        steps = [json.loads(run("estimate", "--plan", str(f), "--json").stdout)["step_time_s"] for f in (planned, back)]
        assert abs(steps[1] / steps[0] - 1) < 1e-9, (target, steps)
        notations = [json.loads(run("explain", str(f), "--json").stdout)["plan"] for f in (planned, back)]
        assert notations[0] == notations[1]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def test_gemma_configs_import():
    """gemma2 / gemma3_text config.json files were refused ('model_type ... is not supported').
    Parameters by hand, tied head, no biases, GeGLU = 3 matrices of D x F, q/o D x H*hd, k/v D x KV*hd:
    Gemma 2 9B  (D 3584, F 14336, 16 x 256 q, 8 x 256 kv, 42 layers, V 256000):
      42 * (2*3584*4096 + 2*3584*2048 + 3*3584*14336 + 2*3584) + 256000*3584 + 3584 = 9,241,404,928
      (Google's 9,241,705,984 adds Gemma 2's two extra norms per layer, 42*2*3584 = 301,056: not priced);
    Gemma 3 12B text (D 3840, F 15360, 16 x 256 q, 8 x 256 kv, 48 layers, V 262208, q/k norms of 256):
      48 * (2*3840*4096 + 2*3840*2048 + 3*3840*15360 + 2*3840 + 2*256) + 262208*3840 + 3840."""
    from meshplan.spec.hf import load_hf_config

    g2 = load_hf_config(FIXTURES / "gemma2-9b" / "config.json")
    assert g2.num_params() == 42 * (2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 2 * 3584) \
        + 256000 * 3584 + 3584 == 9_241_404_928
    assert (g2.tied_embeddings, g2.sliding_window, g2.full_attention_period, g2.qk_norm) == (True, 4096, 2, False)
    g3 = load_hf_config(FIXTURES / "gemma3-12b-text" / "config.json")
    assert g3.num_params() == 48 * (2 * 3840 * 4096 + 2 * 3840 * 2048 + 3 * 3840 * 15360 + 2 * 3840 + 2 * 256) \
        + 262208 * 3840 + 3840
    assert (g3.sliding_window, g3.full_attention_period, g3.qk_norm) == (1024, 6, True)
    r = run("estimate", "--model", str(FIXTURES / "gemma2-9b" / "config.json"), "--gpu", "h100-sxm", "--nodes", "1",
            "--seq-len", "8192", "--global-batch", "64", "--zero", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == "gemma2-9b"
    # sliding windows are planner-only for meshplan's runtime: plan says so and points to a stack that has them
    r = run("plan", "--model", str(FIXTURES / "gemma2-9b" / "config.json"), "--gpu", "h100-sxm", "--nodes", "1",
            "--seq-len", "8192", "--global-batch", "64")
    assert r.returncode == 2 and "sliding-window attention is planner-only" in r.stderr


def test_expert_parallel_over_replicas_says_how_to_shard_them():
    """`--ep 8` over 8 plain data-parallel ranks said only 'ep=8 must divide dp_shard*cp=1'; the
    Megatron user's way out (shard the data-parallel ranks) was left to guess."""
    r = run("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--nodes", "1", "--global-batch", "8",
            "--ep", "8")
    assert r.returncode == 2 and "--zero 1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert run("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--nodes", "1", "--global-batch", "8",
               "--ep", "8", "--zero", "1").returncode == 0


def test_export_refusal_points_to_best(tmp_path):
    """Exporting meshplan's recommendation to a stack that cannot run it ended on the stack's
    reason alone; `--best` (the fastest plan of the job the stack can run) went unmentioned."""
    f = tmp_path / "plan.json"
    plan = run("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "1", "--seq-len", "4096",
               "--global-batch", "16", "--out", str(f))
    assert plan.returncode == 0, plan.stderr
    data = json.loads(f.read_text())
    assert data["plan"]["dims"]["dp_shard"] == 8  # dp8 zero1x8: half of it becomes cp2
    data["plan"]["dims"].update(cp=2, dp_shard=4)  # DeepSpeed's config cannot express context parallel
    g = tmp_path / "cp.json"
    g.write_text(json.dumps(data))
    r = run("export", str(g), "--to", "deepspeed")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "context parallel" in lines[0] and "--best exports the fastest plan" in lines[0]


def test_megatron_bridge_round_trip_keeps_the_recomputed_modules(tmp_path):
    """Megatron-Bridge overrides read back lost model.recompute_modules: Mixtral's
    ckpt=sel(moe_act+layernorm):all came back as ckpt=sel:all (core_attn), another step time."""
    planned, exported, back = tmp_path / "mx.json", tmp_path / "mx.yaml", tmp_path / "back.json"
    # (global batch 512: at 256 the Megatron search, without zero 2, recommends no recompute)
    job = ("--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4", "--seq-len", "4096",
           "--global-batch", "512")
    assert run("plan", *job, "--target", "megatron", "--out", str(planned)).returncode == 0
    assert "moe_act" in json.dumps(json.loads(planned.read_text())["plan"])  # else the case is not exercised
    assert run("export", str(planned), "--to", "megatron-bridge", "--out", str(exported)).returncode == 0
    r = run("import", "--from", "megatron-bridge", str(exported), "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
            "--nodes", "4", "--out", str(back))
    assert r.returncode == 0, r.stderr
    plans = [json.loads(run("explain", str(f), "--json").stdout) for f in (planned, back)]
    assert plans[0]["job"]["flags"] == plans[1]["job"]["flags"]
    assert abs(plans[1]["step_time_s"] / plans[0]["step_time_s"] - 1) < 1e-9


# ---- session 11: the brief's bad inputs on every command, with and without --json ---------------
def _bad_input_files(root: Path) -> None:
    """A plan file with an unknown target, malformed and partial plan JSON, an HF config missing a
    field, a plan that cannot fit (Llama-3.1-405B on 8 A100-40GB)."""
    from meshplan.plan import Job, ParallelDims, Plan
    from meshplan.spec.cluster import cluster_for_gpu
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    nofit = Job(model=model_preset("llama3.1-405b"), training=TrainingSpec(seq_len=4096, global_batch=256),
                cluster=cluster_for_gpu("a100-40gb", gpus_per_node=8), plan=Plan(dims=ParallelDims(tp=8), sp=True))
    nofit.save(root / "nofit.json")
    (root / "target.json").write_text(json.dumps({**nofit.to_dict(), "target": "megatorn"}))
    (root / "malformed.json").write_text("{ not json")
    (root / "partial.json").write_text(json.dumps({"meshplan_plan_version": 3, "model": {"name": "x"}}))
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4,
                                                         "num_attention_heads": 4, "vocab_size": 1000}))


_SIZES = ("--seq-len", "4096", "--global-batch", "256")
BAD_INPUTS = [
    # (argv, what the one line says)
    (["estimate", "--model", "nosuch", "--gpu", "a100-80gb", "--gpus", "8", *_SIZES], "nosuch"),
    (["plan", "--model", "llama3-8b", "--gpu", "h900", "--gpus", "8", *_SIZES], "unknown GPU 'h900'"),
    (["import", "--from", "megatron", "--seq-length 8 --global-batch-size 8", "--gpu", "h900", "--gpus", "8",
      "--model", "llama3-8b"], "unknown GPU 'h900'"),
    (["estimate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "0", *_SIZES], "--gpus must be a positive"),
    (["plan", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len", str(10**30),
      "--global-batch", "8"], "too large"),
    (["estimate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", *_SIZES, "--tp", "3"], "not divisible"),
    (["plan", "--model", "llama3.1-405b", "--gpu", "a100-40gb", "--gpus", "8", *_SIZES], "no plan fits"),
    (["plan", "--compare", "nofit.json"], "no plan fits"),
    (["estimate", "--model", "./hf", "--gpu", "a100-80gb", "--gpus", "8", *_SIZES], "no hidden_size field"),
    (["plan", "--model", "./hf", "--gpu", "a100-80gb", "--gpus", "8", *_SIZES], "no hidden_size field"),
    *[([*cmd, f], says) for f, says in (("malformed.json", "not valid JSON"), ("partial.json", "no 'training' section"),
                                        ("target.json", "target 'megatorn' is not one of"))
      for cmd in (["estimate", "--plan"], ["explain"], ["report", "--out", "r.html", "--plan"],
                  ["train", "--dry-run", "--plan"], ["plan", "--compare"])],
    # export and train --dry-run used a file with an unknown target (the others refused it)
    (["export", "target.json", "--to", "megatron"], "target 'megatorn' is not one of"),
    (["export", "malformed.json", "--to", "megatron"], "not valid JSON"),
]


@pytest.mark.usefixtures("no_processes")
@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
@pytest.mark.parametrize("argv,says", BAD_INPUTS, ids=[" ".join(a)[:60] for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2(argv, says, json_out, tmp_path):
    from _fuzz_harness import run_cli

    _bad_input_files(tmp_path)  # no_processes made tmp_path the working directory
    code, out, err = run_cli([*argv, *(["--json"] if json_out else [])])
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0], (code, err)
    assert out == ""


def test_export_of_a_plan_that_does_not_fit_warns(tmp_path):
    """`export` wrote a config for a run that the cost model says runs out of memory, silently."""
    _bad_input_files(tmp_path)
    r = run("export", "nofit.json", "--to", "megatron", cwd=tmp_path)
    assert r.returncode == 0 and "--tensor-model-parallel-size 8" in r.stdout
    assert "warning: the plan does not fit: it needs" in r.stderr and "a100-40gb has 39.6 GiB" in r.stderr
    warnings = json.loads(run("export", "nofit.json", "--to", "megatron", "--json", cwd=tmp_path).stdout)["warnings"]
    assert any(w.startswith("the plan does not fit") for w in warnings)


def test_train_refuses_a_gpu_plan_that_does_not_fit_before_the_machine_check(tmp_path):
    """`train` of a GPU plan the cost model puts over the GPU's memory said only that the machine has
    no GPU (or, on GPUs, launched into an out-of-memory error): it names the shortfall first, and
    --allow-over-memory gets past it to the machine check."""
    _bad_input_files(tmp_path)
    r = run("train", "--plan", "nofit.json", "--steps", "1", cwd=tmp_path)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "does not fit a100-40gb: short by" in lines[0] and "--allow-over-memory" in lines[0]
    r = run("train", "--plan", "nofit.json", "--steps", "1", "--allow-over-memory", cwd=tmp_path)
    assert r.returncode == 2 and "does not fit" not in r.stderr and "no GPU" in r.stderr
