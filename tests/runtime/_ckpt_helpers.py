"""Shared by the checkpoint tests: tiny Jobs, `meshplan train` as a subprocess, checkpoint contents."""

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

SRC = Path(__file__).resolve().parents[2] / "src"
TIMEOUT_S = 300

TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "64"}


def make_job(path: Path, *, dp_shard: int = 1, tp: int = 1, pp: int = 1, overrides: dict | None = None,
             preset: str = "toy-llama") -> Path:
    """A tiny model (Llama-style by default), global batch 8 x 16 tokens, fp32, on pp x dp_shard x
    tp CPU ranks (with pp, micro-batches of one sequence)."""
    model = resolve_model(preset, {**TINY, **(overrides or {})})
    dims = ParallelDims(dp_shard=dp_shard, tp=tp, pp=pp)
    training = TrainingSpec(seq_len=16, global_batch=8, precision=Precision.FP32)
    plan = Plan(dims=dims, zero=3 if dp_shard > 1 else 0, micro_batch=1 if pp > 1 else 8 // dp_shard)
    Job(model=model, training=training, cluster=resolve_cluster("cpu", gpus=dims.world_size), plan=plan).save(path)
    return path


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def train_cmd(job: Path, ckpt: Path, log: Path, *, steps: int, every: int, keep: int | None = None,
              resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "meshplan", "train", "--plan", str(job), "--steps", str(steps),
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(every), "--log", str(log), "--json"]
    if keep:
        cmd += ["--checkpoint-keep", str(keep)]
    if resume:
        cmd.append("--resume")
    return cmd


def run(cmd: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env(env_extra), capture_output=True, text=True, timeout=TIMEOUT_S)


def run_and_kill_in_save(cmd: list[str], ckpt: Path, *, step: int, rank: int) -> tuple[int, str]:
    """Run with ``rank`` sleeping inside the save of ``step``; SIGKILL it there; wait for the exit."""
    proc = subprocess.Popen(cmd, env=_env({"MESHPLAN_TEST_SLEEP_IN_SAVE": f"{rank}:{step}"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid_file = ckpt / f"step-{step:06d}.tmp" / f"sleeping-rank{rank}.pid"
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the run never reached the save:\n{proc.communicate()[0]}")
            time.sleep(0.1)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def read_losses(*logs: Path) -> dict[int, float]:
    """step -> loss over several JSONL logs; a later log's value for a step replaces an earlier one."""
    out: dict[int, float] = {}
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if not rec.get("summary"):
                    out[rec["step"]] = rec["loss"]
    return out


def checkpoint_tensors(ckpt: Path, tmp: Path) -> dict:
    """A checkpoint's global tensors (``model.<fqn>``, ``optim.state.<fqn>.<k>``), read offline."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(ckpt, out)
    sd = torch.load(out, weights_only=False)
    return {f"{group}.{k}": v for group in ("model", "optim") for k, v in sd[group].items()
            if isinstance(v, torch.Tensor)}
