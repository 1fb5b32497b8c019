"""Fuzz the numeric and text flags added since issue 19 (estimate's plan flags, train's); exit 0
or 2, one ``error:`` line, never a traceback, and train never starts on bad input (harness:
_fuzz_harness.py)."""

from __future__ import annotations

import pytest
from _fuzz_harness import E, EM, FUZZ, ODD_TEXT, assert_clean, cpu_job
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

PLAN_FLAGS = ["--mlp-splits", "--head-splits", "--expert-replicas", "--expert-skew", "--moe-capacity-factor",
              "--vpp", "--dp-shard", "--keep-gathered", "--offload", "--stage-layers", "--recompute-layers",
              "--target", "--global-batch-tokens", "--cp"]
PLAN_TEXT = st.one_of(ODD_TEXT, st.sampled_from(["attention+mlp", "optimizer+params", "params", "activations",
                                                 "embedding+head", "6,6", "2x6", "megatron", "torchtitan",
                                                 "deepspeed", "+", "mlp+mlp"]))


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(PLAN_FLAGS), PLAN_TEXT), min_size=1, max_size=3),
       moe=st.booleans(), base=st.sampled_from([[], ["--zero", "3"], ["--pp", "2", "--vocab-parallel"]]))
def test_fuzz_plan_flags(flags, moe, base, tmp_path_factory):
    argv = (EM if moe else E + ["--model", "gpt2"]) + base
    for flag, value in flags:
        argv += [flag, value]
    assert_clean(argv)


TRAIN_FLAGS = ["--eval-fraction", "--min-lr-ratio", "--clip-grad", "--weight-decay", "--warmup-steps",
               "--collective-timeout-s", "--eval-every", "--checkpoint-every", "--checkpoint-keep", "--ranks"]


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(TRAIN_FLAGS), ODD_TEXT), min_size=1, max_size=3),
       dry_run=st.booleans())
def test_fuzz_train_flags_never_start_on_bad_input(flags, dry_run, tmp_path_factory):
    cpu = tmp_path_factory.mktemp("train") / "cpu.json"
    cpu_job().save(cpu)
    argv = ["train", "--plan", str(cpu)] + (["--dry-run"] if dry_run else [])
    for flag, value in flags:
        argv += [flag, value]
    assert_clean(argv)
