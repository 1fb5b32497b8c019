"""The routing log: a tiny MoE trained on CPU logs per-expert token counts every step, the same
counts whatever the layout, without changing the loss; `estimate --expert-load` reads it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.runtime.launch import launch
from meshplan.runtime.testing import single_process
from meshplan.runtime.train_config import TrainConfig
from meshplan.spec.expert_load import read_expert_load

from _configs import GLOBAL_BATCH, LR, SEQ_LEN, make_job

STEPS = 3


LAYOUTS = {  # two processes each, one launch: ep (sums over ranks), tp (divides), pp (layers apart)
    "ep2": dict(dims=dict(dp_shard=2, ep=2), zero=3),
    "tp2": dict(dims=dict(tp=2)),
    "pp2": dict(dims=dict(pp=2)),
}


def _train(jobs: dict, tmp_path: Path) -> dict[str, tuple[list[dict], Path]]:
    runs, out = [], {}
    for name, job in jobs.items():
        log, routing = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.routing.jsonl"
        runs.append((job, TrainConfig(steps=STEPS, lr=LR, progress=False, log_path=str(log),
                                      expert_load_log=str(routing))))
        out[name] = (log, routing)
    launch(runs, capture=True)
    return {name: ([json.loads(x) for x in log.read_text().splitlines()], routing)
            for name, (log, routing) in out.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing")
    jobs = {name: make_job("moe", **fields) for name, fields in LAYOUTS.items()}
    return {**_train(jobs, tmp), **_train({"one": single_process(jobs["ep2"])}, tmp)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_counts_are_the_layouts_global_routing_and_the_loss_is_unchanged(runs, layout):
    (records, log), (one_records, one_log) = runs[layout], runs["one"]
    load, one_load = read_expert_load(log), read_expert_load(one_log)
    skipped = 1 if layout == "pp2" else 0  # a pipeline's shape-inference step is not logged
    assert len(load.counts) == STEPS - skipped
    for step in load.counts:
        for layer in step:  # every token routed to top_k = 2 experts, summed over the ranks
            assert sum(layer) == GLOBAL_BATCH * SEQ_LEN * 2
    # one process and the layout route the same tokens with the same weights at step 1 (and
    # follow the same losses after it: parity), so they count the same tokens per expert
    assert load.counts[0] == one_load.counts[skipped]
    losses = [r["loss"] for r in records if not r.get("summary")]
    one_losses = [r["loss"] for r in one_records if not r.get("summary")]
    assert losses == pytest.approx(one_losses, rel=1e-5)


def test_step_records_report_the_measured_imbalance(runs):
    records, routing = runs["ep2"]
    steps = [r for r in records if not r.get("summary")]
    load = read_expert_load(routing)
    assert steps[0]["expert_imbalance"] is not None
    for rec, counts in zip(steps, load.counts):
        want = [max(c) * len(c) / sum(c) for c in counts]
        assert rec["expert_imbalance"] == pytest.approx(want)
    summary = next(r for r in records if r.get("summary"))
    assert summary["mean_expert_imbalance"] >= 1.0


def _estimate(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "meshplan", "estimate", "--model", "toy-moe", "--override", "num_layers=2",
           "--gpu", "cpu", "--nodes", "1", "--gpus-per-node", "4", "--dp", "4", "--zero", "1", "--ep", "4",
           "--precision", "fp32", "--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH), "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_estimate_reads_the_log_back_and_a_skewed_log_is_slower(runs, tmp_path):
    _, routing = runs["ep2"]
    load = read_expert_load(routing)
    got = _estimate("--expert-load", str(routing))
    want = sum(max(c) * len(c) / sum(c) for step in load.counts for c in step) / (STEPS * 2)
    assert got["expert_load"]["imbalance"] == pytest.approx(want)
    # the same log with every token of layer 0 sent to experts 0 and 1 (two of the four ep ranks)
    lines = routing.read_text().splitlines()
    skewed = [lines[0]] + [json.dumps({"step": json.loads(x)["step"],
                                       "counts": [[128, 128, 0, 0], json.loads(x)["counts"][1]]}) for x in lines[1:]]
    skewed_path = tmp_path / "skewed.jsonl"
    skewed_path.write_text("\n".join(skewed) + "\n")
    hot = _estimate("--expert-load", str(skewed_path))
    even = _estimate("--expert-skew", "0")
    assert hot["expert_load"]["load_factor"] > got["expert_load"]["load_factor"] >= 1.0
    assert hot["step_time_s"] > got["step_time_s"] >= even["step_time_s"]
