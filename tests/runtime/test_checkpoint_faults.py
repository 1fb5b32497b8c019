"""Checkpoints under faults and re-plans, through `meshplan train` (CPU, gloo, torchrun).

One uninterrupted fsdp4 run (6 steps, a checkpoint every 2, keep 2) is the reference. Then:
- a run whose rank 1 is SIGKILLed inside the step-4 save is resumed (from step 2: the interrupted
  save must not count); rank 1 is SIGKILLed again in the middle of step 5; a second resume (from
  step 4) finishes: every loss, and the final model AND optimizer state, equal the reference EXACTLY;
- the reference's step-4 checkpoint resumed under tp2 on 2 processes, and under pp2 x fsdp4 on 8
  (DCP resharding): losses and final state within fp32 tolerance of the reference.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from _ckpt_helpers import checkpoint_tensors, make_job, read_losses, run, run_and_kill_in_save, train_cmd
from meshplan import ckpt_meta

pytestmark = pytest.mark.runtime

STEPS, EVERY, KEEP = 6, 2, 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    job = make_job(tmp / "fsdp4.json", dp_shard=4)
    r = run(train_cmd(job, tmp / "ckpt", tmp / "log.jsonl", steps=STEPS, every=EVERY, keep=KEEP))
    assert r.returncode == 0, r.stderr[-6000:]
    return {"tmp": tmp, "job": job, "ckpt": tmp / "ckpt", "losses": read_losses(tmp / "log.jsonl"),
            "final": checkpoint_tensors(tmp / "ckpt" / "step-000006", tmp)}


def test_reference_keeps_last_k(reference):
    assert [s for s, _ in ckpt_meta.complete_checkpoints(reference["ckpt"])] == [4, 6]
    assert sorted(reference["losses"]) == list(range(1, STEPS + 1))
    meta = ckpt_meta.read_meta(reference["ckpt"] / "step-000006")
    assert meta.step == 6 and meta.data_position == 6 * 8 and meta.world_size == 4
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in reference["final"])


def test_kill_in_save_then_mid_step_resumes_exactly(reference, tmp_path):
    ckpt, job = tmp_path / "ckpt", reference["job"]
    logs = [tmp_path / f"log{i}.jsonl" for i in range(3)]

    # 1. rank 1 is killed while writing the step-4 checkpoint: step 2 stays the latest.
    rc, out = run_and_kill_in_save(train_cmd(job, ckpt, logs[0], steps=STEPS, every=EVERY, keep=KEEP),
                                   ckpt, step=4, rank=1)
    assert rc != 0, out[-3000:]
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [2]
    assert (ckpt / "step-000004.tmp").is_dir()

    # 2. resume from step 2; rank 1 dies in the middle of step 5 (after backward, before the update).
    r = run(train_cmd(job, ckpt, logs[1], steps=STEPS, every=EVERY, keep=KEEP, resume=True),
            {"MESHPLAN_TEST_KILL_IN_STEP": "1:5"})
    assert r.returncode != 0
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [2, 4]
    assert not (ckpt / "step-000004.tmp").exists()  # the stale staging dir was replaced
    assert sorted(read_losses(logs[1])) == [3, 4]  # resumed at 3: nothing before step 2 was redone

    # 3. resume from step 4 and finish: bit-identical to the uninterrupted run.
    r = run(train_cmd(job, ckpt, logs[2], steps=STEPS, every=EVERY, keep=KEEP, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    assert sorted(read_losses(logs[2])) == [5, 6]
    assert read_losses(*logs) == reference["losses"]
    final = checkpoint_tensors(ckpt / "step-000006", tmp_path)
    assert final.keys() == reference["final"].keys()
    for k, v in reference["final"].items():
        assert torch.equal(final[k], v), k
    assert [s for s, _ in ckpt_meta.complete_checkpoints(ckpt)] == [4, 6]
    assert ckpt_meta.read_meta(ckpt / "step-000006").data_position == STEPS * 8  # counted across resumes


@pytest.mark.parametrize("name,nproc,dims", [("tp2", 2, {"tp": 2}), ("pp2xfsdp4", 8, {"pp": 2, "dp_shard": 4})])
def test_replan_continues_within_fp32_tolerance(reference, tmp_path, name, nproc, dims):
    """fsdp4 on 4 processes -> tp2 on 2, or pp2 x fsdp4 on 8 (each pipeline stage saves its layers)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"] / "step-000004", ckpt / "step-000004")
    job = make_job(tmp_path / f"{name}.json", **dims)
    log = tmp_path / "log.jsonl"
    r = run(train_cmd(job, ckpt, log, steps=STEPS, every=EVERY, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    got = read_losses(log)
    assert sorted(got) == [5, 6]  # continued from step 4
    for step in (5, 6):
        assert got[step] == pytest.approx(reference["losses"][step], rel=1e-5)
    final = checkpoint_tensors(ckpt / "step-000006", tmp_path)
    assert final.keys() == reference["final"].keys()
    for k, v in reference["final"].items():
        torch.testing.assert_close(final[k], v, rtol=1e-4, atol=1e-5, msg=k)
    meta = ckpt_meta.read_meta(ckpt / "step-000006")  # the new checkpoint records the new plan
    assert meta.world_size == nproc and meta.job.plan.dims.world_size == nproc


def test_tied_embeddings_across_pipeline_replans(tmp_path):
    """GPT-2 style tied head: one parameter under fsdp2, a last-stage copy under pp2. fsdp2 -> pp2
    (the copy's Adam moments come from the embedding's) -> fsdp2 matches an uninterrupted run."""
    fsdp = make_job(tmp_path / "fsdp2.json", dp_shard=2, preset="toy-gpt")
    pipe = make_job(tmp_path / "pp2.json", pp=2, preset="toy-gpt")
    ref_ckpt, ckpt = tmp_path / "ref", tmp_path / "ckpt"
    r = run(train_cmd(fsdp, ref_ckpt, tmp_path / "ref.jsonl", steps=STEPS, every=EVERY))
    assert r.returncode == 0, r.stderr[-6000:]
    shutil.copytree(ref_ckpt / "step-000002", ckpt / "step-000002")
    logs = [tmp_path / "pp.jsonl", tmp_path / "back.jsonl"]
    r = run(train_cmd(pipe, ckpt, logs[0], steps=4, every=EVERY, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    r = run(train_cmd(fsdp, ckpt, logs[1], steps=STEPS, every=EVERY, resume=True))
    assert r.returncode == 0, r.stderr[-6000:]
    ref, got = read_losses(tmp_path / "ref.jsonl"), read_losses(*logs)
    assert sorted(got) == [3, 4, 5, 6]
    for step in got:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), step
    final = checkpoint_tensors(ckpt / "step-000006", tmp_path)
    want = checkpoint_tensors(ref_ckpt / "step-000006", tmp_path)
    assert final.keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(final[k], v, rtol=1e-4, atol=1e-5, msg=k)
