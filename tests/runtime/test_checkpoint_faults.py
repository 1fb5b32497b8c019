"""Checkpoints under faults and re-plans, on CPU with gloo (multi-process, torchrun).

One uninterrupted fsdp4 run (6 steps, a checkpoint every 2, keep 2) is the reference. Then:
- a run whose rank 1 is SIGKILLed inside the step-4 save, resumed (from step 2: the interrupted
  save must not count), whose rank 1 is SIGKILLed again mid-step 5, resumed again (from step 4):
  every loss and the final weights equal the reference EXACTLY;
- the reference's step-4 checkpoint resumed under tp2 on 2 processes (DCP resharding): losses and
  final weights within fp32 tolerance of the reference.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from _ckpt_helpers import make_job, read_losses, run_worker, run_worker_and_kill_in_save, write_config
from meshplan import ckpt_meta

pytestmark = pytest.mark.runtime

STEPS, EVERY, KEEP = 6, 2, 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    job = make_job(tmp / "fsdp4.json", dp_shard=4)
    cfg = write_config(tmp, "ref", job=job, steps=STEPS, ckpt_dir=tmp / "ckpt", every=EVERY, keep=KEEP,
                       losses=tmp / "losses.jsonl", weights=tmp / "weights.pt")
    r = run_worker(4, cfg)
    assert r.returncode == 0, r.stderr[-12000:]
    return {"dir": tmp, "job": job, "ckpt": tmp / "ckpt", "losses": read_losses(tmp / "losses.jsonl"),
            "weights": torch.load(tmp / "weights.pt", weights_only=True)}


def test_reference_keeps_last_k(reference):
    assert [s for s, _ in ckpt_meta.complete_checkpoints(reference["ckpt"])] == [4, 6]
    assert sorted(reference["losses"]) == list(range(1, STEPS + 1))


def test_kill_in_save_then_mid_step_resumes_exactly(reference, tmp_path):
    ckpt, losses = tmp_path / "ckpt", tmp_path / "losses.jsonl"
    base = dict(job=reference["job"], steps=STEPS, ckpt_dir=ckpt, every=EVERY, keep=KEEP, losses=losses,
                weights=tmp_path / "weights.pt")

    # 1. rank 1 is killed while writing the step-4 checkpoint: step 2 stays the latest.
    rc, out = run_worker_and_kill_in_save(4, write_config(tmp_path, "a", **base), ckpt, step=4, rank=1)
    assert rc != 0, out[-3000:]
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [2]
    assert (ckpt / "step-000004.tmp").is_dir()
    assert ckpt_meta.latest_checkpoint(ckpt) == ckpt / "step-000002"

    # 2. resume from step 2 (the interrupted save still loads nothing); rank 1 dies mid-step 5.
    r = run_worker(4, write_config(tmp_path, "b", **base, resume=True, kill_rank=1, kill_step=5))
    assert r.returncode != 0
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [2, 4]
    assert not (ckpt / "step-000004.tmp").exists()

    # 3. resume from step 4 and finish: nothing lost, bit-identical to the uninterrupted run.
    r = run_worker(4, write_config(tmp_path, "c", **base, resume=True))
    assert r.returncode == 0, r.stderr[-12000:]
    assert read_losses(losses) == reference["losses"]
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert weights.keys() == reference["weights"].keys()
    for k, v in reference["weights"].items():
        assert torch.equal(weights[k], v), k
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [4, 6]


def test_replan_fsdp4_to_tp2_continues_within_fp32_tolerance(reference, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"] / "step-000004", ckpt / "step-000004")
    job = make_job(tmp_path / "tp2.json", tp=2)
    losses = tmp_path / "losses.jsonl"
    cfg = write_config(tmp_path, "resume_tp2", job=job, steps=STEPS, ckpt_dir=ckpt, every=EVERY, keep=KEEP,
                       losses=losses, weights=tmp_path / "weights.pt", resume=True)
    r = run_worker(2, cfg)
    assert r.returncode == 0, r.stderr[-12000:]
    got = read_losses(losses)
    assert sorted(got) == [5, 6]  # continued from step 4, did not restart
    for step in (5, 6):
        assert got[step] == pytest.approx(reference["losses"][step], rel=1e-5, abs=1e-6)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert weights.keys() == reference["weights"].keys()
    for k, v in reference["weights"].items():
        torch.testing.assert_close(weights[k], v, rtol=1e-4, atol=1e-5, msg=k)
    # the new checkpoint records the new plan
    meta = ckpt_meta.read_meta(ckpt / "step-000006")
    assert meta.world_size == 2 and meta.job.plan.dims.tp == 2
