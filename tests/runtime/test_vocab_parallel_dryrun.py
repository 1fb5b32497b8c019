"""Dry runs of vocabulary-parallel plans through `meshplan train --plan P --dry-run` (fake process
group, full width): the stages' memory is balanced, the pp group carries the collectives the cost
model charges, and the combinations the runtime does not run are refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

pytestmark = pytest.mark.runtime

SRC = str(Path(__file__).resolve().parents[2] / "src")
# GPT-2 width (tied head, learned positions), 2 layers: the vocabulary is most of the weights
MODEL = model_preset("gpt2").with_overrides({"num_layers": 2, "vocab_size": 50304})
BATCH = 8  # 4 sequences per dp rank: 4 micro-batches of 1
PLAN = Plan(dims=ParallelDims(pp=2, dp_shard=2), zero=1, schedule="gpipe")


def _dry_run(tmp_path: Path, plan: Plan, model=MODEL) -> subprocess.CompletedProcess:
    job = Job(model=model, training=TrainingSpec(seq_len=512, global_batch=BATCH),
              cluster=resolve_cluster(gpu="h100-sxm", gpus=plan.dims.world_size), plan=plan)
    path = tmp_path / f"job-{plan.vocab_parallel}-{plan.schedule.value}.json"
    job.save(path)
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(path), "--dry-run", "--simulate", "--json"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def _ranks(proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["ranks"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> list[dict]:
    return _ranks(_dry_run(tmp_path_factory.mktemp("vocab"), replace(PLAN, vocab_parallel=True)))


def test_vocab_parallel_dry_run_balances_the_stages(tmp_path: Path, vocab: list[dict]) -> None:
    plain = _ranks(_dry_run(tmp_path, PLAN))
    assert [r["pp_rank"] for r in vocab] == [0, 1]
    peak = [[r["dry_run"]["peak_bytes"] for r in ranks] for ranks in (plain, vocab)]
    params = [[r["dry_run"]["parameters_bytes"] for r in ranks] for ranks in (plain, vocab)]
    # without: each end holds the whole (V x D) table (the last its tied copy) and the last the
    # (b, S, V) logits; with: half the table each, half the logits each
    assert peak[0][1] > 1.3 * peak[0][0]
    assert abs(peak[1][1] - peak[1][0]) < 0.1 * peak[1][0]
    assert max(peak[1]) < max(peak[0])
    table = MODEL.vocab_size * MODEL.hidden_size * 4 / 2  # fp32, ZeRO-1 shards over dp_shard=2
    for stage in (0, 1):
        assert params[0][stage] - params[1][stage] == pytest.approx(table / 2, rel=0.02)


def test_vocab_parallel_dry_run_collectives_match_the_cost_model(vocab: list[dict]) -> None:
    m = BATCH // 2  # micro-batches per step on a dp rank
    for rank in vocab:
        sync = {c["kind"]: c for c in rank["collectives"] if c["axes"] == ["pp_vocab"]}
        assert set(sync) == {"broadcast", "reduce", "all_reduce"}
        assert sync["broadcast"]["count"] == sync["broadcast"]["model_count"] == m + 1
        assert sync["reduce"]["count"] == sync["reduce"]["model_count"] == m + 1
        assert sync["all_reduce"]["count"] == sync["all_reduce"]["model_count"] == 2 * m
        assert sync["all_reduce"]["bytes"] == sync["all_reduce"]["model_bytes"]  # fp32 statistics
        # the hidden states travel in fp32 (the runtime's residual stream), the model counts bf16
        assert sync["broadcast"]["bytes"] == 2 * sync["broadcast"]["model_bytes"]


@pytest.mark.parametrize("change, says", [
    (dict(schedule="interleaved-1f1b", vpp=2), "gpipe or 1f1b"),
    (dict(dims=ParallelDims(pp=2, tp=2), schedule="gpipe"), "tp=2"),
])
def test_unsupported_vocab_parallel_plans_are_one_line(tmp_path: Path, change: dict, says: str) -> None:
    proc = _dry_run(tmp_path, replace(PLAN, vocab_parallel=True, **change),
                    model=MODEL.with_overrides({"num_layers": 4}))  # 2 virtual stages per rank
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
