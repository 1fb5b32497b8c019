"""`meshplan export` and `meshplan import` through the real entry point."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
GPT3_ARGS = (
    "torchrun --nnodes 192 --nproc-per-node 8 pretrain_gpt.py "
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 "
    "--num-layers-per-virtual-pipeline-stage 4 --num-layers 96 --hidden-size 12288 "
    "--num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 "
    "--micro-batch-size 1 --global-batch-size 1536 --checkpoint-activations --fp16 --lr 6e-5"
)


def run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, cwd=cwd)


@pytest.fixture(scope="module")
def gpt3_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("imp") / "gpt3.json"
    r = run("import", "--from", "megatron", GPT3_ARGS, "--gpu", "a100-80gb", "--model", "gpt3-175b",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_import_megatron_json(gpt3_job):
    r = run("import", "--from", "megatron", GPT3_ARGS, "--gpu", "a100-80gb", "--model", "gpt3-175b", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["notation"] == "dp24 tp8 pp8(interleaved-1f1b,v3) cp1 mb1 ckpt=full:all"
    assert data["cluster"]["num_nodes"] == 192
    assert data["training"]["precision"] == "fp16"
    assert data["ignored_flags"] == ["--lr"]
    saved = json.loads(gpt3_job.read_text())
    assert saved["plan"] == data["plan"]


def test_export_all_targets(gpt3_job, tmp_path):
    r = run("export", str(gpt3_job), "--to", "megatron")
    assert r.returncode == 0, r.stderr
    assert "--num-layers-per-virtual-pipeline-stage 4 \\" in r.stdout
    out = tmp_path / "job.toml"
    r = run("export", str(gpt3_job), "--to", "torchtitan", "--target-version", "0.2.0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "bfloat16" in r.stderr
    toml = tomllib.loads(out.read_text())
    assert toml["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    r = run("export", str(gpt3_job), "--to", "deepspeed", "--json")
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "1F1B only" in r.stderr


@pytest.mark.parametrize("version,suffix,n_warnings", [("0.2.0", "toml", 2), ("0.3.0", "sh", 3)])
def test_export_json_and_torchtitan_import(gpt3_job, tmp_path, version, suffix, n_warnings):
    """Both torchtitan forms (TOML before 0.3, command line since) import back to the same plan;
    the command line names MODULE/CONFIG placeholders for GPT-3, which torchtitan has no entry for."""
    r = run("export", str(gpt3_job), "--to", "torchtitan", "--target-version", version, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["target"] == "torchtitan" and len(data["warnings"]) == n_warnings
    path = tmp_path / f"t.{suffix}"
    path.write_text(data["text"])
    r = run("import", "--from", "torchtitan", str(path), "--model", "gpt3-175b", "--gpu", "a100-80gb",
            "--nodes", "192", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["notation"] == "dp24 tp8sp pp8(interleaved-1f1b,v3) cp1 mb1 ckpt=full:all"


def test_import_torchtitan_command_line_names_its_preset(tmp_path):
    """--module llama3 --config llama3_8b is meshplan's llama3-8b: no --model needed."""
    golden = Path(__file__).resolve().parents[1] / "golden" / "export" / "llama8b_zero2.torchtitan-0.3.0.sh"
    r = run("import", "--from", "torchtitan", str(golden), "--cluster", "dgx-h100", "--nodes", "2", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"]["name"] == "llama3-8b"
    assert data["notation"] == "dp16 zero2x16 tp1 pp1 cp1 mb2 ckpt=full:all"


@pytest.mark.parametrize("args,msg", [
    (["export", "nope.json", "--to", "megatron"], "no such plan file"),
    (["import", "--from", "megatron", "--seq-length 2048 --global-batch-size 8", "--gpu", "a100-80gb",
      "--gpus", "8"], "give --model"),
    (["import", "--from", "megatron", "--seq-length 2048", "--model", "gpt2", "--gpu", "a100-80gb"],
     "GPU count"),
    (["import", "--from", "torchtitan", "missing.toml", "--model", "gpt2", "--gpu", "a100-80gb",
      "--gpus", "8"], "no such torchtitan config"),
])
def test_bad_input_is_one_line_exit_2(args, msg, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert msg in r.stderr


def test_megatron_bridge_export_and_import(gpt3_job, tmp_path):
    """The Bridge overrides of GPT-3 (no recipe: a placeholder and a warning) import back."""
    out = tmp_path / "gpt3.overrides"
    r = run("export", str(gpt3_job), "--to", "megatron-bridge", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "recipe=RECIPE" in out.read_text() and "no recipe for gpt3-175b" in r.stderr
    r = run("import", "--from", "megatron-bridge", str(out), "--model", "gpt3-175b", "--gpu", "a100-80gb",
            "--nodes", "192", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["notation"] == "dp24 tp8 pp8(interleaved-1f1b,v3) cp1 mb1 ckpt=full:all"
    bad = tmp_path / "bad.overrides"
    bad.write_text("recipe=RECIPE\nmodel.num_layers=96\nnonsense\n")
    r = run("import", "--from", "megatron-bridge", str(bad), "--model", "gpt3-175b", "--gpu", "a100-80gb",
            "--nodes", "192")
    assert r.returncode == 2 and "line 3" in r.stderr and r.stderr.count("\n") == 1


def test_bad_target_version(gpt3_job):
    r = run("export", str(gpt3_job), "--to", "torchtitan", "--target-version", "latest")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "not of the form 0.3.0" in r.stderr


def test_import_with_hf_config_model(tmp_path):
    cfg = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama3-8b" / "config.json"
    r = run("import", "--from", "megatron", "--tensor-model-parallel-size 2 --micro-batch-size 2 "
            "--global-batch-size 64 --seq-length 8192 --bf16 --recompute-granularity selective "
            "--sequence-parallel", "--model", str(cfg), "--cluster", "dgx-h100", "--nodes", "2", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"]["name"] == "meta-llama/Meta-Llama-3-8B"
    assert data["notation"] == "dp8 tp2sp pp1 cp1 mb2 ckpt=sel:all"


def test_export_best_expressible(tmp_path):
    """--best searches the job's setting and exports the fastest fitting plan DeepSpeed can run."""
    job = tmp_path / "mine.json"
    r = run("import", "--from", "megatron", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
            "--num-layers-per-virtual-pipeline-stage 3 --micro-batch-size 1 --global-batch-size 32 "
            "--seq-length 1024 --bf16", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus-per-node", "4",
            "--gpus", "4", "--out", str(job))
    assert r.returncode == 0, r.stderr
    assert run("export", str(job), "--to", "deepspeed").returncode == 2  # interleaved: refused
    r = run("export", str(job), "--to", "deepspeed", "--best", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    cfg = json.loads(data["text"])
    assert cfg["train_batch_size"] == 32
    assert cfg["train_batch_size"] % (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]) == 0
    assert data["best"]["plan"] and data["best"]["peak_memory_gib"] < 80


def test_unreadable_and_unwritable_paths(gpt3_job, tmp_path):
    r = run("import", "--from", "megatron", "@" + str(tmp_path / "none.txt"), "--model", "gpt2",
            "--gpu", "a100-80gb", "--gpus", "8")
    assert r.returncode == 2 and "cannot read the Megatron arguments" in r.stderr
    r = run("export", str(gpt3_job), "--to", "megatron", "--out", str(tmp_path / "no" / "dir" / "x.args"))
    assert r.returncode == 2 and r.stderr.startswith("error: cannot write")


def test_import_torchtitan_flavor_preset():
    toml = Path(__file__).resolve().parents[1] / "fixtures" / "torchtitan" / "llama3_8b.toml"
    r = run("import", "--from", "torchtitan", str(toml), "--cluster", "dgx-h100", "--nodes", "8", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"]["name"] == "llama3-8b"
    assert data["notation"] == "dp8 fsdp8 tp8sp pp1 cp1 mb1 ckpt=sel:all"
