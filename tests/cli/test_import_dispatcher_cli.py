"""The MoE dispatcher an import reads: a Megatron-LM command line without
--moe-token-dispatcher-type runs Megatron's default, allgather (megatron/training/arguments.py@000c4ac,
_add_moe_args), not meshplan's; a Megatron-Bridge override file without it keeps meshplan's (the
recipe sets its own, not known here). Through the real entry point."""

from __future__ import annotations

import json
import shlex

import pytest
from _fuzz_harness import MEGATRON_ARGS, run_cli

from meshplan.spec.training import MoeDispatcher, TrainingSpec

pytestmark = pytest.mark.usefixtures("no_processes")


def _imported(args: list[str]) -> dict:
    code, out, err = run_cli(["import", "--from", "megatron", shlex.join(args + ["--use-distributed-optimizer"]),
                              "--gpu", "a100-80gb", "--gpus", "8", "--json"])
    assert code == 0, err
    return json.loads(out)


def _dispatcher(out: dict) -> str:
    found = [v for k, v in _walk(out) if k == "moe_dispatcher"]
    assert len(set(found)) == 1, found
    return found[0]


def _walk(d):
    if isinstance(d, dict):
        for k, v in d.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(d, list):
        for v in d:
            yield from _walk(v)


def test_megatron_without_the_flag_is_allgather():
    assert TrainingSpec(seq_len=8, global_batch=8).moe_dispatcher != MoeDispatcher.ALLGATHER  # else no test
    assert _dispatcher(_imported(MEGATRON_ARGS)) == "allgather"


@pytest.mark.parametrize("given", ["alltoall", "allgather", "flex"])
def test_megatron_with_the_flag_is_what_it_says(given):
    extra = ["--moe-token-dispatcher-type", given] + (["--moe-enable-deepep"] if given == "flex" else [])
    assert _dispatcher(_imported(MEGATRON_ARGS + extra)) == given


def test_bridge_without_the_override_keeps_meshplans_default(tmp_path):
    text = "\n".join(["recipe=megatron.bridge.recipes.llama.llama3:llama3_8b_pretrain_config",
                      "train.global_batch_size=64", "model.seq_length=4096",
                      "model.tensor_model_parallel_size=2"])
    path = tmp_path / "bridge.txt"
    path.write_text(text + "\n")
    code, out, err = run_cli(["import", "--from", "megatron-bridge", str(path), "--model", "mixtral-8x7b",
                              "--gpu", "h100-sxm", "--gpus", "16", "--json"])
    if code == 2:
        pytest.fail(err)
    assert _dispatcher(json.loads(out)) == TrainingSpec(seq_len=8, global_batch=8).moe_dispatcher.value
