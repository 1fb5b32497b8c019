"""A new user's walk with ZeRO over one rank (session 12): `export` writes it for the stack that
runs it or refuses it in one line, with and without --json, and `import --from megatron` reads a
file named without '@' (as the Megatron-Bridge and torchtitan imports do) and refuses an instance
count that Megatron-LM would refuse, in one line (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import run_cli

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)


@pytest.fixture()
def zero1_replicas(tmp_path):
    f = tmp_path / "z1.json"
    Job(model=model_preset("gpt2"), training=TrainingSpec(seq_len=1024, global_batch=64),
        cluster=cluster_for_gpu("a100-80gb", gpus_per_node=8),
        plan=Plan(dims=ParallelDims(dp_replicate=8), zero=1)).save(f)
    return str(f)


def _refused(argv, fragment):
    code, out, err = run_cli(argv)
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:] and fragment in lines[-1], err


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_export_zero_over_one_rank(zero1_replicas, json_flag):
    code, out, err = run_cli(["export", zero1_replicas, "--to", "megatron", *json_flag])
    assert code == 0, err
    text = json.loads(out)["text"] if json_flag else out
    assert "--num-distributed-optimizer-instances 8" in text
    _refused(["export", zero1_replicas, "--to", "torchtitan", *json_flag], "torchtitan applies FSDP only over")
    _refused(["export", zero1_replicas, "--to", "deepspeed", *json_flag], "with 8 replicas is not expressible")


ARGS = ("--global-batch-size 64 --seq-length 1024 --num-layers 12 --hidden-size 768 --num-attention-heads 12 "
        "--max-position-embeddings 1024 --vocab-size 50257 --use-distributed-optimizer --context-parallel-size 2")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_import_megatron_file_named_alone(tmp_path, json_flag):
    """The file's path alone used to be read as a launch line with no arguments ('the Megatron
    arguments give no --global-batch-size')."""
    f = tmp_path / "args.sh"
    f.write_text(ARGS + " --num-distributed-optimizer-instances 8\n")
    base = ["import", str(f), "--from", "megatron", "--gpu", "a100-80gb", "--gpus", "16",
            "--out", str(tmp_path / "job.json"), *json_flag]
    code, out, err = run_cli(base)
    assert code == 0, err
    if json_flag:
        json.loads(out)
    plan = Job.load(tmp_path / "job.json").plan
    assert (plan.zero, plan.dims.dp_replicate, plan.dims.dp_shard, plan.dims.cp) == (1, 8, 1, 2)
    f.write_text(ARGS + " --num-distributed-optimizer-instances 3\n")
    _refused(base, "does not divide dp*cp=16")
