"""Shared by the checkpoint tests: build Jobs and launch the checkpoint worker under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec

TESTS_DIR = Path(__file__).resolve().parent
SRC = TESTS_DIR.parents[1] / "src"
WORKER = TESTS_DIR / "_ckpt_worker.py"

TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "64"}


def make_job(path: Path, *, dp_shard: int = 1, tp: int = 1, overrides: dict | None = None) -> Path:
    model = resolve_model("toy-llama", {**TINY, **(overrides or {})})
    dims = ParallelDims(dp_shard=dp_shard, tp=tp)
    training = TrainingSpec(seq_len=16, global_batch=8, precision=Precision.FP32)
    plan = Plan(dims=dims, zero=3 if dp_shard > 1 else 0, micro_batch=8 // dp_shard)
    job = Job(model=model, training=training, cluster=resolve_cluster("cpu", gpus=dims.world_size), plan=plan)
    job.save(path)
    return path


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _cmd(nproc: int, cfg_path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", str(WORKER), str(cfg_path)]


def write_config(tmp: Path, name: str, **cfg) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in cfg.items()}))
    return path


def run_worker(nproc: int, cfg_path: Path, env_extra: dict | None = None, timeout_s: float = 240):
    env = {**_env(), **(env_extra or {})}
    return subprocess.run(_cmd(nproc, cfg_path), env=env, capture_output=True, text=True, timeout=timeout_s)


def run_worker_and_kill_in_save(nproc: int, cfg_path: Path, ckpt_dir: Path, step: int, rank: int,
                                timeout_s: float = 240):
    """Launch with ``rank`` sleeping inside the save of ``step``; SIGKILL it there; wait."""
    env = {**_env(), "MESHPLAN_TEST_SLEEP_IN_SAVE": f"{rank}:{step}"}
    staging = ckpt_dir / f"step-{step:06d}.tmp"
    proc = subprocess.Popen(_cmd(nproc, cfg_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    pid_file = staging / f"sleeping-rank{rank}.pid"
    deadline = time.monotonic() + timeout_s
    try:
        while not pid_file.exists() or not pid_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker never reached the save:\n{proc.communicate()[0]}")
            time.sleep(0.1)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def read_losses(path: Path) -> dict[int, float]:
    """step -> loss; a later line for a step (a resumed run redoing it) replaces an earlier one."""
    out: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out[rec["step"]] = rec["loss"]
    return out
