"""HSDP with gradient accumulation (runtime/parallelize.py ``set_accumulation``): zero 2/3 sum the
reduce-scattered shards over the micro-batches and all-reduce them over the replicas once, on the
last (FSDP2's set_requires_all_reduce); the losses and weights still match the one-process run
(CPU, gloo, 2 replicas x 2 shards, 2 micro-batches per rank). The collective count is in
tests/runtime/test_dryrun.py (test_hsdp_all_reduces_the_replicas_once_per_step)."""

from __future__ import annotations

import pytest

from meshplan.runtime.testing import parity_errors

from _configs import STEPS, layout_runs

pytestmark = pytest.mark.runtime

LAYOUTS = {  # global batch 8 over dp 4: 2 micro-batches of 1 per rank
    "hsdp_2x2_zero2_accum": ("llama", dict(dims=dict(dp_replicate=2, dp_shard=2), zero=2)),
    "hsdp_2x2_zero3_accum_gpt": ("gpt", dict(dims=dict(dp_replicate=2, dp_shard=2), zero=3)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(LAYOUTS, tmp_path_factory, "hsdpacc")


@pytest.mark.parametrize("name", LAYOUTS)
def test_hsdp_accumulation_parity(name, runs):
    got, ref = runs[name]
    assert len(got.losses) == STEPS
    errors = parity_errors(got, ref)
    assert not errors, f"{name}: " + "; ".join(errors[:5])
