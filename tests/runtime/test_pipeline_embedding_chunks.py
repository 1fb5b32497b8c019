"""Pipeline stages holding only the embedding or only the loss (Megatron's
``--account-for-embedding/loss-in-pipeline-split`` with one slot per virtual stage, the layout the
search offers as ``num_layers + 2`` chunks) train as one process does: loss per step, gradient
norms and final weights (the checks of test_pipeline_parity.py, through its torchrun worker).

4 layers + E + L = 6 slots over pp2 x v3, one per virtual stage: stages 0..5 hold E, layer 0,
layer 1, layer 2, layer 3, L; stage s runs on rank s % 2, so rank 0 runs E, layer 1, layer 3 and
rank 1 layer 0, layer 2, L."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_pipeline_parity import check, real, run_worker, toy

pytestmark = pytest.mark.runtime

torch = pytest.importorskip("torch")

LAYOUT = {"dims": {"pp": 2}, "schedule": "interleaved-1f1b", "vpp": 3, "stage_layers": [0, 1, 1, 1, 1, 0]}

TWO_RANKS = [
    real("llama-pp2-v3-embedding-loss", "toy-llama", LAYOUT),
    # tied embeddings: the embedding-only stage and the loss-only stage hold the two copies
    real("gpt-pp2-v3-embedding-loss-tied-selective", "toy-gpt", {**LAYOUT, "recompute": "selective"}),
    toy("toy-pp2-v3-embedding-loss-tied", LAYOUT, tied=True),
]
FOUR_RANKS = [
    # ZeRO-3 over the stage: FSDP2 shards the embedding-only and the head-only stages too
    real("llama-pp2v3xfsdp2-zero3-embedding-loss", "toy-llama",
         {**LAYOUT, "dims": {"pp": 2, "dp_shard": 2}, "zero": 3}, batch=8),
    real("llama-pp2v3xtp2-sp-embedding-loss", "toy-llama", {**LAYOUT, "dims": {"pp": 2, "tp": 2}, "sp": True}),
]


def test_embedding_and_loss_stages_match_one_process(tmp_path: Path) -> None:
    check(run_worker(TWO_RANKS, 2, tmp_path), TWO_RANKS)


def test_embedding_and_loss_stages_with_fsdp_and_tp(tmp_path: Path) -> None:
    check(run_worker(FOUR_RANKS, 4, tmp_path), FOUR_RANKS)
