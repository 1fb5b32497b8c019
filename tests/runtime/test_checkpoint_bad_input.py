"""Bad checkpoints are refused with one line naming the file, before anything is loaded.

A real one-process checkpoint is made in this process (gloo, world size 1); copies of it are then
damaged. ``load_checkpoint`` must raise MeshplanError and leave the model's weights untouched;
``meshplan train --resume`` must exit 2 with one line before it launches any worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from _ckpt_helpers import SRC, make_job
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.runtime.checkpoint import load_checkpoint
from meshplan.runtime.mesh import build_mesh
from meshplan.runtime.models import build_model
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.optim import make_optimizer
from meshplan.runtime.train import train
from meshplan.runtime.train_config import TrainConfig

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_input")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), 1), rank=0, world_size=1)
    try:
        job_path = make_job(tmp / "one.json")
        train(Job.load(job_path), TrainConfig(steps=2, checkpoint_dir=str(tmp / "ckpt"), checkpoint_every=1,
                                              progress=False))
        yield {"tmp": tmp, "job_path": job_path, "ckpt": tmp / "ckpt"}
    finally:
        dist.destroy_process_group()


def fresh_model(job: Job):
    plan = job.full_plan
    model = build_model(job.model, "meta")
    parallelize(model, plan, build_mesh(plan, "cpu"))
    model.init_device = torch.device("cpu")
    model.init_weights(123)
    return model, make_optimizer(job, list(model.parameters()), 1e-3)


def damaged_copy(saved, tmp_path, damage):
    root = tmp_path / "ckpt"
    shutil.copytree(saved["ckpt"], root)
    damage(root / "step-000002")
    return root


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CASES = {
    "truncated shard": (lambda d: truncate(d / "__0_0.distcp"), r"__0_0\.distcp: truncated or changed"),
    "missing shard": (lambda d: (d / "__0_0.distcp").unlink(), r"__0_0\.distcp: missing checkpoint file"),
    "missing DCP index": (lambda d: (d / ".metadata").unlink(), r"\.metadata: missing checkpoint file"),
    "corrupt metadata": (lambda d: (d / "meshplan_checkpoint.json").write_text("{"),
                         r"meshplan_checkpoint\.json: not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_refuses_damaged_checkpoint_and_loads_nothing(saved, tmp_path, case):
    damage, message = CASES[case]
    root = damaged_copy(saved, tmp_path, damage)
    job = Job.load(saved["job_path"])
    model, opt = fresh_model(job)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(MeshplanError, match=message):
        load_checkpoint(root / "step-000002", job=job, model_parts=model, optimizers=opt)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not opt.state  # no optimizer state was loaded either


def test_load_refuses_another_model(saved, tmp_path):
    other = Job.load(make_job(tmp_path / "other.json", overrides={"hidden_size": "48"}))
    model, opt = fresh_model(other)
    with pytest.raises(MeshplanError, match=r"another model .*hidden_size=32.*hidden_size=48"):
        load_checkpoint(saved["ckpt"], job=other, model_parts=model, optimizers=opt)


def test_good_checkpoint_loads_step_and_weights(saved):
    job = Job.load(saved["job_path"])
    model, opt = fresh_model(job)
    state = load_checkpoint(saved["ckpt"], job=job, model_parts=model, optimizers=opt)
    assert state.step == 2 and state.data_position == 16
    again, opt2 = fresh_model(job)
    load_checkpoint(saved["ckpt"] / "step-000002", job=job, model_parts=again, optimizers=opt2)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    assert opt.state  # AdamW moments came back
    other_lr = make_optimizer(job, list(again.parameters()), 5e-2)
    load_checkpoint(saved["ckpt"], job=job, model_parts=again, optimizers=other_lr)
    assert other_lr.param_groups[0]["lr"] == 1e-3  # hyperparameters are the checkpoint's


def _train_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", "train", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_train_resume_refuses_before_launch(saved, tmp_path):
    job = str(saved["job_path"])
    root = damaged_copy(saved, tmp_path, lambda d: truncate(d / "__0_0.distcp"))
    r = _train_cli("--plan", job, "--resume", "--checkpoint-dir", str(root), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "__0_0.distcp: truncated" in r.stderr

    other = make_job(tmp_path / "other.json", overrides={"num_layers": "3"})
    r = _train_cli("--plan", str(other), "--resume", "--checkpoint-dir", str(saved["ckpt"]), cwd=tmp_path)
    assert r.returncode == 2 and "checkpoint is for another model" in r.stderr and "num_layers=2" in r.stderr

    not_ckpt = tmp_path / "notes"
    not_ckpt.mkdir()
    (not_ckpt / "readme.txt").write_text("hello")
    r = _train_cli("--plan", job, "--resume", "--checkpoint-dir", str(not_ckpt), cwd=tmp_path)
    assert r.returncode == 2 and "not a meshplan checkpoint directory" in r.stderr

    r = _train_cli("--plan", job, "--resume", "--checkpoint-dir", str(saved["ckpt"]), "--steps", "2", cwd=tmp_path)
    assert r.returncode == 0 and "nothing to do" in r.stdout  # already at step 2: no launch

    r = _train_cli("--plan", job, "--checkpoint-dir", str(saved["ckpt"]), cwd=tmp_path)  # would overwrite
    assert r.returncode == 2 and "already holds checkpoints (latest step-000002); pass --resume" in r.stderr
