"""Checkpoint metadata without torch: which checkpoint is the latest, and what makes one bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan import ckpt_meta
from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec

TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "64"}


def tiny_job(dp_shard: int = 4, **overrides: str) -> Job:
    model = resolve_model("toy-llama", {**TINY, **overrides})
    training = TrainingSpec(seq_len=16, global_batch=8, precision=Precision.FP32)
    plan = Plan(dims=ParallelDims(dp_shard=dp_shard), zero=3 if dp_shard > 1 else 0, micro_batch=8 // dp_shard)
    return Job(model=model, training=training, cluster=resolve_cluster("cpu", gpus=dp_shard), plan=plan)


def fake_checkpoint(root: Path, step: int, job: Job | None = None, staging: bool = False) -> Path:
    """A checkpoint directory laid out as checkpoint.py commits one (shard contents are dummies)."""
    job = job or tiny_job()
    d = root / (ckpt_meta.step_dirname(step) + (ckpt_meta.STAGING_SUFFIX if staging else ""))
    d.mkdir(parents=True)
    world = job.plan.dims.world_size
    names = [ckpt_meta.DCP_INDEX_FILENAME] + [f"__{r}_0.distcp" for r in range(world)] \
        + [ckpt_meta.rng_filename(r) for r in range(world)]
    for i, n in enumerate(names):
        (d / n).write_bytes(bytes(100 + i))
    files = tuple(CheckpointFile(name=n, size_bytes=(d / n).stat().st_size) for n in names)
    meta = CheckpointMeta(step=step, data_position=step * job.training.global_batch, data_seed=7,
                          world_size=world, job=job, files=files)
    if not staging:
        (d / ckpt_meta.META_FILENAME).write_text(json.dumps(meta.to_dict()))
    return d


def test_latest_skips_staging_and_uncommitted(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 12, staging=True)  # interrupted save
    (tmp_path / "step-000014").mkdir()  # no metadata: never committed
    assert [s for s, _ in ckpt_meta.complete_checkpoints(tmp_path)] == [2, 10]
    assert ckpt_meta.latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    ckpt, meta = ckpt_meta.load_meta(tmp_path)
    assert ckpt == tmp_path / "step-000010" and meta.step == 10 and meta.data_position == 80


def test_meta_round_trip(tmp_path):
    d = fake_checkpoint(tmp_path, 3)
    meta = ckpt_meta.read_meta(d)
    assert CheckpointMeta.from_dict(meta.to_dict()) == meta
    assert meta.job.plan.dims.dp_shard == 4 and meta.world_size == 4


def test_not_a_checkpoint(tmp_path):
    fake_checkpoint(tmp_path, 4, staging=True)
    with pytest.raises(MeshplanError, match=r"not a meshplan checkpoint.*only interrupted saves: step-000004.tmp"):
        ckpt_meta.load_meta(tmp_path)
    with pytest.raises(MeshplanError, match="no such checkpoint directory"):
        ckpt_meta.load_meta(tmp_path / "nope")


def test_missing_and_truncated_shard_named(tmp_path):
    d = fake_checkpoint(tmp_path, 4)
    (d / "__2_0.distcp").unlink()
    with pytest.raises(MeshplanError, match=r"__2_0\.distcp: missing checkpoint file"):
        ckpt_meta.load_meta(d)
    d = fake_checkpoint(tmp_path / "b", 4)
    data = (d / "__1_0.distcp").read_bytes()
    (d / "__1_0.distcp").write_bytes(data[:10])
    with pytest.raises(MeshplanError, match=r"__1_0\.distcp: truncated or changed \(10 bytes"):
        ckpt_meta.load_meta(d)


def test_corrupt_metadata_named(tmp_path):
    d = fake_checkpoint(tmp_path, 4)
    (d / ckpt_meta.META_FILENAME).write_text("{not json")
    with pytest.raises(MeshplanError, match=r"meshplan_checkpoint.json: not valid JSON"):
        ckpt_meta.load_meta(d)
    (d / ckpt_meta.META_FILENAME).write_text(json.dumps({"meshplan_checkpoint_version": 99}))
    with pytest.raises(MeshplanError, match="format version 99 is not supported"):
        ckpt_meta.load_meta(d)


def test_other_model_refused_naming_field(tmp_path):
    d = fake_checkpoint(tmp_path, 4)
    saved = ckpt_meta.read_meta(d).job.model
    ckpt_meta.check_same_model(d, saved, saved)  # same model passes
    other = tiny_job(hidden_size="48", ffn_hidden_size="64").model
    with pytest.raises(MeshplanError, match=r"another model .*hidden_size=32.*hidden_size=48"):
        ckpt_meta.check_same_model(d, saved, other)


def test_check_resume(tmp_path):
    model = tiny_job().model
    assert ckpt_meta.check_resume(tmp_path / "new", model, resume=True) is None  # fresh start
    assert ckpt_meta.check_resume(tmp_path / "new", model, resume=False) is None
    fake_checkpoint(tmp_path / "ck", 2, staging=True)  # only an interrupted first save: fresh start
    assert ckpt_meta.check_resume(tmp_path / "ck", model, resume=True) is None
    d = fake_checkpoint(tmp_path / "ck", 4)
    assert ckpt_meta.check_resume(tmp_path / "ck", model, resume=True) == d
    with pytest.raises(MeshplanError, match="already holds checkpoints"):
        ckpt_meta.check_resume(tmp_path / "ck", model, resume=False)
    with pytest.raises(MeshplanError, match="is one checkpoint; give its parent directory"):
        ckpt_meta.check_resume(d, model, resume=True)
    with pytest.raises(MeshplanError, match="another model"):
        ckpt_meta.check_resume(tmp_path / "ck", tiny_job(num_layers="4").model, resume=True)
