"""A Megatron-LM 2020-22 command line (examples/sc21 style: --checkpoint-activations, no
--sequence-parallel) imports as a Job of today's Megatron-Core stack, and the import says so:
which calibration it estimates with and, for that era's spellings, the estimate as Megatron-LM of
that era ran it (the frameworks.json ``megatron-lm`` settings ``meshplan validate`` costs the
published 2021 rows with). Through the real entry point."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import run_cli

pytestmark = pytest.mark.usefixtures("no_processes")

SC21 = ("torchrun --nnodes 4 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 2 --num-layers 24 --hidden-size 4096 --num-attention-heads 32 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 256 "
        "--vocab-size 51200 --fp16 --lr 1e-4 {recompute}")


def _import(recompute: str, *extra: str) -> tuple[int, str, str]:
    return run_cli(["import", "--from", "megatron", SC21.format(recompute=recompute), "--gpu", "a100-80gb", *extra])


def test_2021_command_line_says_which_calibration_and_gives_that_eras_estimate():
    code, out, err = _import("--checkpoint-activations", "--json")
    assert code == 0, err
    cal = json.loads(out)["calibration"]
    assert cal["stack"] == "megatron" and cal["framework"] == "megatron-core"
    legacy = cal["legacy"]
    assert legacy["flags"] == ["--checkpoint-activations"] and legacy["framework"] == "megatron-lm"
    assert "megatron-lm settings" in legacy["source"] and "megatron-core settings" in cal["source"]
    # unfused attention, dropout, no TP communication overlap: slower than today's stack
    assert 0 < legacy["tokens_per_s_per_gpu"] < cal["tokens_per_s_per_gpu"]
    code, out, err = _import("--checkpoint-activations")
    assert code == 0, err
    assert "megatron-core (megatron calibration)" in out and "Megatron-LM 2020-22 style (--checkpoint-activations)" in out


def test_todays_spelling_has_no_era_note():
    code, out, err = _import("--recompute-granularity full --recompute-method uniform", "--json")
    assert code == 0, err
    cal = json.loads(out)["calibration"]
    assert cal["legacy"] is None and cal["framework"] == "megatron-core"
    code, out, _ = _import("--recompute-granularity full --recompute-method uniform")
    assert "2020-22" not in out
