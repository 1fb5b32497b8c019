"""FSDP2 mixed precision as the runtime applies it (parallelize(..., param_dtype=bf16)): bf16
compute copies of fp32 master weights, fp32 gradients, also with no data parallel (a 1-rank FSDP
group). bf16 against bf16: three SGD steps of the tiny Llama equal, within bf16 rounding, the same
model trained with fp32 weights under CPU autocast (the runtime's path before mixed precision).
One process (gloo, world size 1), in a subprocess to keep the process group out of pytest's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

torch = pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[2] / "src"
BF16_LOSS_RTOL = 2e-2
"""bf16 has an 8-bit mantissa (relative step 2^-8 = 0.4%); norms and embeddings computed with
bf16 weights instead of fp32 ones under autocast move the loss by a few of those steps."""

WORKER = r'''
import json, sys
import torch, torch.distributed as dist
from meshplan.plan import Job
from meshplan.runtime.mesh import build_mesh
from meshplan.runtime.models import build_model
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.microbatch import token_loss_sum
sys.path.insert(0, sys.argv[1])
from _configs import make_job

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
job = make_job("llama")
plan = job.full_plan
gen = torch.Generator().manual_seed(0)
tokens = torch.randint(0, job.model.vocab_size, (4, 17), generator=gen)
x, y = tokens[:, :-1], tokens[:, 1:]

def run(mixed):
    model = build_model(job.model, "meta")
    if mixed:
        parallelize(model, plan, build_mesh(plan, "cpu"), param_dtype=torch.bfloat16)
    model.init_device = torch.device("cpu")
    model.init_weights(0)
    seen = []
    model.layers["0"].attention.wq.register_forward_pre_hook(lambda m, a: seen.append(str(m.weight.dtype)))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = token_loss_sum(model(x), y) / y.numel()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = sorted({str(p.dtype) for p in model.parameters()})
    grads = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
    return {"losses": losses, "compute": sorted(set(seen)), "params": params, "grads": grads}

print(json.dumps({"mixed": run(True), "autocast": run(False)}))
'''


def test_bf16_mixed_precision_matches_bf16_autocast(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", WORKER, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    mixed, autocast = out["mixed"], out["autocast"]
    assert mixed["compute"] == ["torch.bfloat16"]  # the layers compute with bf16 weight copies
    assert autocast["compute"] == ["torch.float32"]
    assert mixed["params"] == ["torch.float32"] and mixed["grads"] == ["torch.float32"]  # fp32 masters
    for step, (a, b) in enumerate(zip(mixed["losses"], autocast["losses"], strict=True)):
        assert abs(a - b) <= BF16_LOSS_RTOL * abs(b), f"step {step}: {a} vs {b}"
    assert mixed["losses"][-1] < mixed["losses"][0]  # it trains
