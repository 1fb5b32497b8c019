"""Same plan, same hardware profile: every command predicts the same step time and memory
(issue 12, item 1). Each command goes through the real entry point; ``train``'s predicted side
is ``calib.predict.predict``, the function ``meshplan train`` calls after its run.

Before the profile had one resolution (``calib.hardware.resolve_hardware``), ``plan
--cluster-profile`` searched with the measured rates but the preset factors (0.022 s where
``estimate`` said 0.042 s), and ``estimate --plan job.json --cluster-profile`` fitted the factors
but kept the Job's preset rates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan import ckpt_meta
from meshplan.calib.predict import predict
from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.cli.plan_flags import PlanFlags, build_plan
from meshplan.plan import Job
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"
PROFILE = str(Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "cpu_profile_2cores.json")
PROCS = 4
SHAPE = ["--model", "toy-llama", "--seq-len", "64", "--global-batch", "8", "--precision", "fp32"]
FLAGS = ["--tp", "2", "--zero", "1", "--micro-batch", "2"]
REL = 1e-9


def meshplan(*args: str, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=180)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def the_job() -> Job:
    """The plan of FLAGS, built as ``estimate`` builds it from the same flags."""
    cluster = resolve_cluster("cpu", gpus=PROCS)
    plan = build_plan(PROCS, PlanFlags(tp=2, zero=1, micro_batch=2))
    training = TrainingSpec(seq_len=64, global_batch=8, precision=Precision.FP32)
    return Job(model=resolve_model("toy-llama", {}), training=training, cluster=cluster, plan=plan)


def checkpoint_of(job: Job, root: Path) -> Path:
    """A checkpoint directory of ``job`` as checkpoint.py commits it (replan reads only its metadata)."""
    d = root / ckpt_meta.step_dirname(2)
    d.mkdir(parents=True)
    names = [ckpt_meta.DCP_INDEX_FILENAME] + [f"__{r}_0.distcp" for r in range(PROCS)]
    for n in names:
        (d / n).write_bytes(b"x" * 64)
    meta = CheckpointMeta(step=2, data_position=16, data_seed=7, world_size=PROCS, job=job,
                          files=tuple(CheckpointFile(name=n, size_bytes=64) for n in names))
    (d / ckpt_meta.META_FILENAME).write_text(json.dumps(meta.to_dict()))
    return d


def point(d: dict) -> tuple[float, float]:
    return d["step_time_s"], d["peak_memory_gib"]


def fit_point(d: dict) -> tuple[float, float]:
    """A search's point as `estimate` reports it: the memory "fits" compares (the search ranks on it)."""
    return d["step_time_s"], d["fit_memory_gib"]


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("consistency") / "job.json"
    the_job().save(path)
    return path


def test_one_plan_one_profile_one_prediction(job_file: Path):
    cwd = job_file.parent
    flags = point(meshplan("estimate", *SHAPE, "--cluster", "cpu", "--gpus-per-node", str(PROCS), *FLAGS,
                           "--cluster-profile", PROFILE, "--json", cwd=cwd))
    from_file = point(meshplan("estimate", "--plan", str(job_file), "--cluster-profile", PROFILE, "--json", cwd=cwd))
    compared = meshplan("plan", "--compare", str(job_file), "--cluster-profile", PROFILE, "--json", cwd=cwd)
    report = meshplan("report", "--plan", str(job_file), "--out", str(cwd / "r.html"), "--cluster-profile", PROFILE,
                      "--json", cwd=cwd)
    explained = point(meshplan("explain", str(job_file), "--cluster-profile", PROFILE, "--json", cwd=cwd))
    pred = predict(Job.load(job_file), PROFILE)
    without = point(meshplan("estimate", "--plan", str(job_file), "--json", cwd=cwd))
    assert point(meshplan("explain", str(job_file), "--json", cwd=cwd)) == pytest.approx(without, rel=REL)
    bare = predict(Job.load(job_file))  # train without a profile: the same resolution, preset rates
    assert (bare.step_time_s, bare.peak_memory_gib) == pytest.approx(without, rel=REL)

    assert from_file == pytest.approx(flags, rel=REL)
    assert explained == pytest.approx(flags, rel=REL)
    assert point(compared["comparison"]["yours"]) == pytest.approx(flags, rel=REL)
    assert point(report["comparison"]["yours"]) == pytest.approx(flags, rel=REL)
    assert (pred.step_time_s, pred.peak_memory_gib) == pytest.approx(flags, rel=REL)
    assert without[0] != pytest.approx(flags[0], rel=0.05)  # the profile does change the answer


def test_searches_use_the_same_resolution(job_file: Path):
    """plan, replan and export --best search with the profile: the plans they pick are estimated
    exactly as ``estimate --plan FILE --cluster-profile`` estimates them."""
    cwd = job_file.parent
    planned = meshplan("plan", *SHAPE, "--cluster", "cpu", "--gpus", str(PROCS), "--cluster-profile", PROFILE,
                       "--out", str(cwd / "rec.json"), "--top", "0", "--json", cwd=cwd)
    rec = planned["frontier"][planned["recommended"]]
    again = meshplan("estimate", "--plan", str(cwd / "rec.json"), "--cluster-profile", PROFILE, "--json", cwd=cwd)
    assert fit_point(again) == pytest.approx(fit_point(rec), rel=REL)
    assert predict(Job.load(cwd / "rec.json"), PROFILE).step_time_s == pytest.approx(rec["step_time_s"], rel=REL)

    root = cwd / "ckpt"
    checkpoint_of(Job.load(job_file), root)
    replanned = meshplan("replan", "--checkpoint", str(root), "--gpus", str(PROCS), "--out", str(cwd / "re.json"),
                         "--cluster-profile", PROFILE, "--json", cwd=cwd)
    again = meshplan("estimate", "--plan", str(cwd / "re.json"), "--cluster-profile", PROFILE, "--json", cwd=cwd)
    assert fit_point(replanned["new"]) == pytest.approx(fit_point(again), rel=REL)

    best = meshplan("export", str(job_file), "--to", "torchtitan", "--best", "--cluster-profile", PROFILE,
                    "--json", cwd=cwd)["best"]
    # export --best searches torchtitan's space with torchtitan's calibration: its frontier is
    # `plan --target torchtitan`'s (the stacks' memory terms differ, e.g. FSDP2's ZeRO-1/2 buffers)
    titan = meshplan("plan", *SHAPE, "--cluster", "cpu", "--gpus", str(PROCS), "--cluster-profile", PROFILE,
                     "--target", "torchtitan", "--top", "0", "--json", cwd=cwd)
    same = [p for p in titan["frontier"] if p["plan"] == best["plan"]]
    assert same, f"{best['plan']} is not on plan's frontier"
    assert best["tokens_per_s_per_gpu"] == pytest.approx(same[0]["tokens_per_s_per_gpu"], rel=REL)
    assert best["peak_memory_gib"] == pytest.approx(same[0]["peak_memory_gib"], rel=REL)
