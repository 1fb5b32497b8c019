"""`meshplan train --init-from/--tokenizer` and `meshplan export-weights`: refusals in one line
(exit 2) before anything is launched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Optimizer, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"


def meshplan(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


@pytest.fixture
def job(tmp_path) -> Path:
    path = tmp_path / "job.json"
    Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=16, global_batch=4, optimizer=Optimizer.SGD),
        cluster=resolve_cluster("cpu", gpus=1), plan=Plan(dims=ParallelDims())).save(path)
    return path


def test_loop_flags_are_checked(job, tmp_path):
    assert "--eval-every needs --tokenizer" in _error(meshplan("train", "--plan", str(job), "--eval-every", "5"))
    assert "--tokenizer needs --data" in _error(meshplan("train", "--plan", str(job), "--tokenizer", str(tmp_path)))
    assert "--weight-decay needs the adamw optimizer" in _error(
        meshplan("train", "--plan", str(job), "--weight-decay", "0.1"))


def test_init_from_refuses_a_directory_without_weights(job, tmp_path):
    assert "no such config.json" in _error(meshplan("train", "--plan", str(job), "--init-from", str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 64, "vocab_size": 64}))
    assert "no model.safetensors" in _error(meshplan("train", "--plan", str(job), "--init-from", str(tmp_path)))


def test_init_from_names_an_unmapped_tensor(job, tmp_path):
    pytest.importorskip("transformers")
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, rms_norm_eps=1e-5)).save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["model.layers.0.self_attn.sinks"] = torch.zeros(4)
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    line = _error(meshplan("train", "--plan", str(job), "--init-from", str(tmp_path / "m")))
    assert "model.layers.0.self_attn.sinks has no mapping" in line


def test_export_weights_refuses_a_non_checkpoint(tmp_path):
    assert _error(meshplan("export-weights", str(tmp_path / "nope"), str(tmp_path / "out")))
    assert "--max-shard-gb must be positive" in _error(
        meshplan("export-weights", str(tmp_path), str(tmp_path / "out"), "--max-shard-gb", "0"))
