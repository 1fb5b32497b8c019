"""`meshplan replan` through the real entry point, on checkpoint directories laid out as
checkpoint.py commits them (replan reads only the metadata, so shard contents are dummies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from meshplan import ckpt_meta
from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "64"}


def fake_checkpoint(root: Path, step: int, dp_shard: int = 4) -> Path:
    model = resolve_model("toy-llama", TINY)
    training = TrainingSpec(seq_len=16, global_batch=8, precision=Precision.FP32)
    plan = Plan(dims=ParallelDims(dp_shard=dp_shard), zero=3, micro_batch=8 // dp_shard)
    job = Job(model=model, training=training, cluster=resolve_cluster("cpu", gpus=dp_shard), plan=plan)
    d = root / ckpt_meta.step_dirname(step)
    d.mkdir(parents=True)
    names = [ckpt_meta.DCP_INDEX_FILENAME] + [f"__{r}_0.distcp" for r in range(dp_shard)]
    for n in names:
        (d / n).write_bytes(b"x" * 64)
    meta = CheckpointMeta(step=step, data_position=8 * step, data_seed=7, world_size=dp_shard, job=job,
                          files=tuple(CheckpointFile(name=n, size_bytes=64) for n in names))
    (d / ckpt_meta.META_FILENAME).write_text(json.dumps(meta.to_dict()))
    return d


def meshplan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_replan_to_fewer_gpus_writes_plan_and_prints_resume_command(tmp_path):
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 2)
    fake_checkpoint(root, 4)
    out = tmp_path / "two.json"
    r = meshplan("replan", "--checkpoint", str(root), "--gpus", "2", "--out", str(out), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["step"] == 4 and res["checkpoint"].endswith("step-000004")
    assert res["old"]["num_gpus"] == 4 and res["new"]["num_gpus"] == 2
    assert res["command"] == f"meshplan train --plan {out} --resume --checkpoint-dir {root}"
    job = Job.load(out)  # a valid Job: same model and batch, 2 ranks
    assert job.plan.dims.world_size == 2 and job.cluster.num_gpus == 2
    assert job.model == resolve_model("toy-llama", TINY) and job.training.global_batch == 8

    r = meshplan("replan", "--checkpoint", str(root), "--gpus", "8", cwd=tmp_path)  # human output
    assert r.returncode == 0, r.stderr
    assert "meshplan train --plan replan.json --resume --checkpoint-dir" in r.stdout
    assert Job.load(tmp_path / "replan.json").plan.dims.world_size == 8


def test_replan_bad_checkpoints_one_line_exit_2(tmp_path):
    r = meshplan("replan", "--checkpoint", str(tmp_path), "--gpus", "2", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "not a meshplan checkpoint" in r.stderr
    d = fake_checkpoint(tmp_path / "ckpt", 4)
    (d / "__3_0.distcp").write_bytes(b"x" * 10)
    r = meshplan("replan", "--checkpoint", str(d), "--gpus", "2", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "__3_0.distcp: truncated" in r.stderr
    r = meshplan("replan", "--checkpoint", str(d), "--gpus", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--gpus must be a positive integer" in r.stderr


def test_replan_runs_without_torch(tmp_path):
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 4)
    code = (
        "import sys, importlib.abc\n"
        "class _Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, _Block())\n"
        f"sys.argv = ['meshplan', 'replan', '--checkpoint', {str(root)!r}, '--gpus', '2', '--json']\n"
        "from meshplan.cli.main import main\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["new"]["num_gpus"] == 2
