"""Loss and final-weight parity of parallel layouts against one process (CPU, gloo, multi-process).

Every layout trains the same tiny model on the same synthetic tokens for STEPS SGD steps; the
per-step losses and the final full weights must match the one-process run within fp32 tolerance.
Layouts of one world size share one torchrun launch (module-scoped fixtures) to keep CI short.
"""

from __future__ import annotations

import pytest

from meshplan.runtime.testing import parity_errors, run_jobs, single_process

from _configs import LR, STEPS, make_job

pytestmark = pytest.mark.runtime

# name -> (model, plan fields). Each one varies something the others do not.
LAYOUTS_2 = {
    "dp2_accum": ("llama", dict(dims=dict(dp_replicate=2), micro_batch=2)),  # 2 micro-batches/rank
    "zero1_accum": ("llama", dict(dims=dict(dp_shard=2), zero=1, micro_batch=2)),
    "zero2_accum": ("llama", dict(dims=dict(dp_shard=2), zero=2, micro_batch=2)),
    "fsdp2_full_ckpt": ("llama", dict(dims=dict(dp_shard=2), zero=3, recompute="full")),
    "fsdp2_gpt_tied": ("gpt", dict(dims=dict(dp_shard=2), zero=3)),
    "tp2_gpt_tied": ("gpt", dict(dims=dict(tp=2))),
    "tp2_sp_selective": ("llama", dict(dims=dict(tp=2), sp=True, recompute="selective")),
    "tp2_sp_gpt": ("gpt", dict(dims=dict(tp=2), sp=True, micro_batch=4)),  # learned positions + SP
    "cp2_a2a": ("llama", dict(dims=dict(cp=2), cp_method="all-to-all")),
    "cp2_a2a_gpt": ("gpt", dict(dims=dict(cp=2), cp_method="all-to-all")),  # learned positions + CP
    "ep2_fsdp2": ("moe", dict(dims=dict(dp_shard=2, ep=2), zero=3)),
    "moe_dp2": ("moe", dict(dims=dict(dp_replicate=2))),
    "moe_tp2": ("moe", dict(dims=dict(tp=2))),  # experts computed whole on each tp rank
    "ep2_over_cp2": ("moe", dict(dims=dict(cp=2, ep=2), cp_method="all-to-all")),  # ep borrows cp ranks
    "cp2_ring_gpt_selective": ("gpt", dict(dims=dict(cp=2), cp_method="ring", recompute="selective")),
}
LAYOUTS_4 = {
    # 2 micro-batches per rank: the replicas all-reduce the summed shards once, on the last
    # (parallelize.set_accumulation; the count: test_dryrun.py test_hsdp_all_reduces_the_replicas_once_per_step)
    "hsdp_2x2": ("llama", dict(dims=dict(dp_replicate=2, dp_shard=2), zero=3)),
    "hsdp_2x2_zero2": ("llama", dict(dims=dict(dp_replicate=2, dp_shard=2), zero=2)),
    "fsdp2_tp2_sp": ("llama", dict(dims=dict(dp_shard=2, tp=2), zero=3, sp=True)),
    "dp2_cp2": ("llama", dict(dims=dict(dp_replicate=2, cp=2), cp_method="all-to-all")),
    "cp2_tp2_sp_gpt": ("gpt", dict(dims=dict(cp=2, tp=2), sp=True, cp_method="all-to-all")),
    "ep2_edp2_zero2": ("moe", dict(dims=dict(dp_shard=4, ep=2), zero=2, micro_batch=1)),
    "cp4_ring": ("llama", dict(dims=dict(cp=4), cp_method="ring")),  # blocks pass 3 hops
    "tp4_gqa_kv_replicated": ("llama", dict(dims=dict(tp=4))),  # 2 KV heads over 4 tp ranks
    "tp4_sp_gqa_kv_replicated": ("llama", dict(dims=dict(tp=4), sp=True)),
}
LAYOUTS_8 = {
    "dp2_fsdp2_tp2": ("llama", dict(dims=dict(dp_replicate=2, dp_shard=2, tp=2), zero=3, sp=True)),
}


def _run(layouts, tmp_path_factory, name):
    jobs = [make_job(model, **dict(fields)) for model, fields in layouts.values()]
    results = run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp(name))
    return dict(zip(layouts, results))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    models = ("llama", "gpt", "moe")
    jobs = [single_process(make_job(m)) for m in models]
    return dict(zip(models, run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp("ref"))))


@pytest.fixture(scope="module")
def results_2(tmp_path_factory):
    return _run(LAYOUTS_2, tmp_path_factory, "w2")


@pytest.fixture(scope="module")
def results_4(tmp_path_factory):
    return _run(LAYOUTS_4, tmp_path_factory, "w4")


@pytest.fixture(scope="module")
def results_8(tmp_path_factory):
    return _run(LAYOUTS_8, tmp_path_factory, "w8")


def _check(name, layouts, results, references):
    model = layouts[name][0]
    got, ref = results[name], references[model]
    assert len(got.losses) == STEPS
    errors = parity_errors(got, ref)
    assert not errors, f"{name}: " + "; ".join(errors[:5])


@pytest.mark.parametrize("name", LAYOUTS_2)
def test_parity_2_ranks(name, results_2, references):
    _check(name, LAYOUTS_2, results_2, references)


@pytest.mark.parametrize("name", LAYOUTS_4)
def test_parity_4_ranks(name, results_4, references):
    _check(name, LAYOUTS_4, results_4, references)


@pytest.mark.parametrize("name", LAYOUTS_8)
def test_parity_8_ranks(name, results_8, references):
    _check(name, LAYOUTS_8, results_8, references)


def test_reference_learns_and_differs_by_model(references):
    """Guards the parity tests against a vacuous reference: weights move and models differ."""
    for ref in references.values():
        assert len(ref.losses) == STEPS and all(l > 0 for l in ref.losses)
    assert references["llama"].losses[0] != references["gpt"].losses[0]


def test_parity_detects_a_wrong_layout(references, results_2):
    """A run of another model must fail the parity check (the check is not vacuous)."""
    assert parity_errors(results_2["tp2_gpt_tied"], references["llama"])
