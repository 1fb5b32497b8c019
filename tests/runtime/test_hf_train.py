"""Issue 20's done-when: a tiny Llama and tokenizer made locally with transformers; `meshplan train
--init-from` on 2 CPU ranks (tp2 and fsdp2) gives transformers' own first-step loss on the same
batch; 20 steps on a local jsonl with warmup, cosine decay, clipping and weight decay; a rank killed
mid-step and the run resumed repeats the logged losses exactly; the exported directory reloads in
transformers with the checkpoint's logits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import torch  # noqa: E402

from _ckpt_helpers import read_losses, run  # noqa: E402
from _hf_fixtures import make_llama, make_mixtral, make_tokenizer, write_jsonl  # noqa: E402
from meshplan.plan import Job, ParallelDims, Plan  # noqa: E402
from meshplan.spec.cluster import resolve_cluster  # noqa: E402
from meshplan.spec.hf import load_hf_config  # noqa: E402
from meshplan.spec.training import Optimizer, Precision, TrainingSpec  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

SEQ, BATCH, STEPS, EVERY, KILL_STEP = 16, 4, 20, 10, 15
FP32_REL_TOL = 1e-5
"""fp32 sums in another order (sharded matmuls, loss_parallel): ~1e-7 relative observed."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    vocab = make_tokenizer(d / "tok")
    make_llama(d / "llama", vocab=vocab)
    make_mixtral(d / "mixtral", vocab=vocab)
    write_jsonl(d / "data.jsonl", 300)
    layouts = (("tp2", "llama", {"tp": 2}, 0, 4), ("fsdp2", "llama", {"dp_shard": 2}, 3, 2),
               ("pp2", "llama", {"pp": 2}, 0, 1), ("ep2", "mixtral", {"dp_shard": 2, "ep": 2}, 3, 2))
    for name, model, dims, zero, mb in layouts:
        Job(model=load_hf_config(d / model), training=TrainingSpec(seq_len=SEQ, global_batch=BATCH, optimizer=Optimizer.ADAMW,
                                              precision=Precision.FP32),
            cluster=resolve_cluster("cpu", gpus=2),
            plan=Plan(dims=ParallelDims(**dims), zero=zero, micro_batch=mb)).save(d / f"{name}.json")
    return d


def _train(d: Path, plan: str, log: Path, steps: int, *extra: str, env: dict | None = None, model: str = "llama"):
    cmd = [sys.executable, "-m", "meshplan", "train", "--plan", str(d / f"{plan}.json"), "--steps", str(steps),
           "--init-from", str(d / model), "--tokenizer", str(d / "tok"), "--data", str(d / "data.jsonl"),
           "--eval-fraction", "0.1", "--log", str(log), "--json", *extra]
    return run(cmd, env)


def _hf_first_step(d: Path, model_dir: str = "llama") -> tuple[float, float]:
    """transformers' loss and global gradient norm on the batch of step 1 (the run's data order)."""
    from transformers import AutoModelForCausalLM

    from meshplan.runtime.datasets import load_packed

    packed = load_packed(d / "data.jsonl", d / "tok", seq_len=SEQ, global_batch=BATCH, vocab_size=64,
                         seed=0, eval_fraction=0.1)
    x, y = packed.batch(1)
    model = AutoModelForCausalLM.from_pretrained(d / model_dir, dtype=torch.float32)
    loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
    return loss.item(), norm.item()


@pytest.mark.parametrize("plan,model", [("fsdp2", "llama"), ("pp2", "llama"), ("ep2", "mixtral")])
def test_first_step_loss_and_grad_norm_match_transformers(files, tmp_path, plan, model):
    r = _train(files, plan, tmp_path / "log.jsonl", 1, "--clip-grad", "1.0", model=model)
    assert r.returncode == 0, r.stderr[-4000:]
    first = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    hf_loss, hf_norm = _hf_first_step(files, model)
    assert first["loss"] == pytest.approx(hf_loss, rel=FP32_REL_TOL)
    assert first["grad_norm"] == pytest.approx(hf_norm, rel=1e-4)  # global norm: shards, stages, experts


def test_tp2_trains_resumes_exactly_and_exports(files, tmp_path):
    ckpt, logs = tmp_path / "ckpt", [tmp_path / "log0.jsonl", tmp_path / "log1.jsonl"]
    loop = ("--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY), "--warmup-steps", "3", "--cosine",
            "--clip-grad", "1.0", "--weight-decay", "0.1", "--lr", "1e-2", "--eval-every", "5")
    # 1. rank 1 dies in the middle of step 15 (after backward, before the update)
    r = _train(files, "tp2", logs[0], STEPS, *loop, env={"MESHPLAN_TEST_KILL_IN_STEP": f"1:{KILL_STEP}"})
    assert r.returncode != 0
    before = read_losses(logs[0])
    assert sorted(before) == list(range(1, KILL_STEP))
    hf_loss, hf_norm = _hf_first_step(files)
    assert before[1] == pytest.approx(hf_loss, rel=FP32_REL_TOL)
    first = json.loads(logs[0].read_text().splitlines()[0])
    assert first["grad_norm"] == pytest.approx(hf_norm, rel=1e-4)  # clipping sees the global norm
    assert first["lr"] == pytest.approx(1e-2 / 3)  # warmup step 1 of 3
    # 2. resume from step 10: steps 11..14 repeat bit for bit (data order, AdamW moments, lr schedule)
    r = _train(files, "tp2", logs[1], STEPS, *loop, "--resume")
    assert r.returncode == 0, r.stderr[-4000:]
    after = read_losses(logs[1])
    assert sorted(after) == list(range(EVERY + 1, STEPS + 1))
    assert {s: after[s] for s in range(EVERY + 1, KILL_STEP)} == {s: before[s] for s in range(EVERY + 1, KILL_STEP)}
    records = [json.loads(x) for x in logs[1].read_text().splitlines()]
    summary = records[-1]
    assert summary["final_loss"] < 0.8 * before[1]  # it learned the word order
    assert summary["final_eval_loss"] is not None and summary["loop"]["param_groups"][0]["weight_decay"] == 0.1
    assert records[-2]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine reaches min_lr_ratio * lr = 0
    # 3. export the step-20 checkpoint and reload it in transformers: same logits as the checkpoint's
    out = tmp_path / "exported"
    r = run([sys.executable, "-m", "meshplan", "export-weights", str(ckpt), str(out), "--to", "hf",
             "--max-shard-gb", "0.00003", "--json"])
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads(r.stdout)["shards"] > 1 and (out / "model.safetensors.index.json").is_file()
    _check_export_logits(ckpt / "step-000020", out)


def _check_export_logits(ckpt: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    from meshplan import ckpt_meta
    from meshplan.runtime.hf_export import read_model_tensors
    from meshplan.runtime.models import build_model

    ours = build_model(ckpt_meta.read_meta(ckpt).job.model, "cpu")
    ours.load_state_dict(read_model_tensors(ckpt))
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    x = torch.randint(0, 30, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(x).logits, ours(x), rtol=1e-5, atol=1e-5)
