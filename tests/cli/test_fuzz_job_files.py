"""Fuzz Job (plan) files: every command that reads one, and the plans the runtime cannot run;
exit 0 or 2, one ``error:`` line, never a traceback (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import FUZZ, ODD_JSON, assert_clean, cpu_job, dump_json, mutated, write
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)


def test_the_good_job_is_accepted(tmp_path, moe_job_dict):
    """The good form the properties mutate: a refusal below is the mutation's."""
    plan = write(tmp_path, "job.json", dump_json(moe_job_dict))
    assert assert_clean(["explain", str(plan), "--json"])[0] == 0


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(),
       command=st.sampled_from(["explain", "estimate", "export-megatron", "export-torchtitan", "export-deepspeed",
                                "plan-compare"]))
def test_fuzz_job_file(pick, value, delete, command, moe_job_dict, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("job"), "job.json", dump_json(mutated(moe_job_dict, pick, value, delete=delete)))
    argv = {"explain": ["explain", str(path), "--json"], "estimate": ["estimate", "--plan", str(path), "--json"],
            "export-megatron": ["export", str(path), "--to", "megatron", "--json"],
            "export-torchtitan": ["export", str(path), "--to", "torchtitan", "--json"],
            "export-deepspeed": ["export", str(path), "--to", "deepspeed", "--json"],
            "plan-compare": ["plan", "--compare", str(path), "--top", "1", "--json"]}[command]
    assert_clean(argv)


# ---- plans the runtime cannot run: refused on one line, before any process -------------------------
TP2 = {"dp_replicate": 1, "dp_shard": 1, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "etp": 0}
PP2 = {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "pp": 2, "cp": 1, "ep": 1, "etp": 0}


@pytest.mark.parametrize(("model", "plan", "expect"), [
    ({"vocab_size": 255}, {"dims": TP2}, "not divisible by tp=2"),  # the runtime's own rule (targets.py)
    ({}, {"dims": PP2, "micro_batch": 8}, "needs at least 2 micro-batches"),  # torch's Schedule1F1B
    ({}, {"dims": PP2, "stage_layers": [1, 2]}, "stage_layers sum to 3"),
    ({}, {"head_splits": 3}, "head_splits=3"),
    ({}, {"keep_gathered": ["mlp"]}, "keep_gathered needs zero 3"),
    ({}, {"expert_placement": "balanced"}, "need ep > 1"),
], ids=["vocab-tp", "1f1b-microbatches", "stage-layers", "head-splits", "keep-gathered", "expert-placement"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["train", "dry-run-simulate"])
def test_train_refusals_are_one_line(model, plan, expect, dry_run, tmp_path):
    """Refused by train and by a simulated dry run (the layout of ``--dry-run`` alone prints the
    refusal beside the layout: tests/cli/test_dryrun_layout_cli.py)."""
    d = cpu_job().to_dict()
    d["model"].update(model)
    d["plan"].update(plan)
    path = write(tmp_path, "job.json", dump_json(d))
    code, err = assert_clean(["train", "--plan", str(path)] + (["--dry-run", "--simulate"] if dry_run else []))
    assert code == 2 and expect in err, err


# ---- regressions: inputs that raised a traceback before the fuzz module's fixes ---------------------
def _job_with(d: dict, where: tuple, value) -> dict:
    d = json.loads(json.dumps(d))
    node = d
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return d


@pytest.mark.parametrize(("where", "value", "expect"), [
    (("model",), None, "'model' section must be an object, got None"),  # TypeError: not iterable
    (("training",), 0.5, "'training' section must be an object, got 0.5"),
    (("plan",), [1], "'plan' section must be an object, got [1]"),
    (("cluster",), "dgx-h100", "'cluster' section must be an object"),
    (("training", "expert_load", "counts", 0, 0, 0), 10**30, "token counts must be non-negative integers, got 1000000000000000000000000000000 (at most"),  # OverflowError
    (("model", "attention_sinks"), {}, "attention_sinks must be true or false, got {}"),  # unhashable in a cache
    (("model", "name"), [1], "name must be text, got [1]"),
], ids=["model-null", "training-number", "plan-list", "cluster-text", "expert-count-huge", "model-bool-dict",
        "model-name-list"])
def test_regression_job_file(where, value, expect, moe_job_dict, tmp_path):
    path = write(tmp_path, "job.json", dump_json(_job_with(moe_job_dict, where, value)))
    code, err = assert_clean(["explain", str(path), "--json"])
    assert code == 2 and expect in err, err
