"""torchtitan >= 0.3 command line: version choice, a hand-written command line, bad input."""

from dataclasses import replace

import pytest

import export_cases as cases
from _framework_pins import pinned
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_torchtitan import import_torchtitan
from meshplan.export.import_torchtitan_cli import parse_command_line, preset_for
from meshplan.export.torchtitan_cli import CURRENT_VERSION, parse_version, stage_modules, uses_command_line
from meshplan.plan import CPMethod, ParallelDims, Plan, Recompute
from meshplan.spec.training import Precision, Recipe


@pytest.mark.parametrize("version,cli", [("0.3.0", True), ("0.3.1+cu128", True), ("1.0", True),
                                         ("0.2.2", False), ("v0.1.0", False)])
def test_form_follows_version(version, cli):
    assert uses_command_line(version) == cli
    text = export_job(cases.llama8b_zero2(), "torchtitan", version).text
    assert ("--module llama3 --config llama3_8b" in text) == cli
    assert ("[parallelism]" in text) == (not cli)


@pytest.mark.parametrize("bad", ["latest", "", "0.x"])
def test_bad_version(bad):
    with pytest.raises(MeshplanError, match="not of the form"):
        parse_version(bad)


def test_issue_command_line_imports():
    """The issue's example: FSDP 8 with local batch 1 on llama3_8b; the rest are defaults
    (data_parallel_shard_degree -1 would take the ranks left; AC defaults to selective)."""
    parsed = parse_command_line("torchrun --nproc-per-node 8 -m torchtitan.train --module llama3 "
                                "--config llama3_8b --parallelism.data_parallel_shard_degree 8 "
                                "--training.local_batch_size=1 --metrics.log_freq 10")
    assert preset_for(parsed.module, parsed.config) == "llama3-8b"
    assert parsed.ignored == ("--metrics.log_freq",)
    imp = import_torchtitan(parsed.cfg, num_gpus=8, num_layers=32)
    assert imp.plan.dims == ParallelDims(dp_shard=8) and imp.plan.zero == 3
    assert imp.plan.micro_batch == 1 and imp.training.global_batch == 8
    assert imp.plan.recompute == Recompute.SELECTIVE


def test_stage_modules_hold_embeddings_and_head():
    assert stage_modules((2, 1)) == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "lm_head"]]


def test_uneven_split_round_trips():
    job = cases.llama8b_zero2()
    plan = Plan(dims=ParallelDims(dp_shard=4, pp=4), zero=3, micro_batch=1, stage_layers=(7, 9, 9, 7))
    text = export_job(replace(job, plan=plan), "torchtitan", "0.3.0").text
    back = import_torchtitan(parse_command_line(text).cfg, num_gpus=16, num_layers=32).plan
    assert back.stage_layers == (7, 9, 9, 7) and back.dims.pp == 4


def test_refusals_and_warnings():
    job = cases.llama8b_zero2()
    with pytest.raises(MeshplanError, match="float8"):  # a recipe torchtitan has, but not from the command line
        export_job(replace(job, training=replace(job.training, precision=Precision.FP8, recipe=Recipe.TENSORWISE)),
                   "torchtitan", "0.3.0")
    with pytest.raises(MeshplanError, match="no delayed fp8 recipe"):  # the default fp8 recipe: none in torchtitan
        export_job(replace(job, training=replace(job.training, precision=Precision.FP8)), "torchtitan", "0.3.0")
    cp = replace(job, plan=Plan(dims=ParallelDims(dp_shard=8, cp=2), zero=3, cp_method=CPMethod.ALL_TO_ALL))
    assert any("rotate-method" in w for w in export_job(cp, "torchtitan", "0.3.0").warnings)
    fp16 = replace(job, training=replace(job.training, precision=Precision.FP16))
    assert "--training.mixed_precision_param bfloat16" in export_job(fp16, "torchtitan", "0.3.0").text


@pytest.mark.parametrize("text,msg", [
    ("--module llama3 --config llama3_8b activation_checkpoint:sometimes", "not one of"),
    ("--module llama3 --config llama3_8b activation_checkpoint:memory-budget", "compiler"),
    ("--module llama3 --config llama3_8b activation_checkpoint:full stray", "not an option"),
    ("--module llama3 --config llama3_8b stray", "takes one value"),
    ("--module llama3 --config llama3_8b --parallelism.module_fqns_per_model_part "
     "tok_embeddings,layers.1 layers.0,norm,lm_head", "in order"),
    ("--module llama3 --config llama3_8b --parallelism.module_fqns_per_model_part "
     "tok_embeddings,layers.0,norm layers.1,lm_head", "not a block"),
    ("--module llama3 --config 'llama3_8b", "cannot be split"),
])
def test_bad_command_lines(text, msg):
    with pytest.raises(MeshplanError, match=msg):
        parse_command_line(text)


def test_the_exporter_targets_the_pinned_torchtitan():
    """One version: the command line ``export --to torchtitan`` writes by default is for the
    torchtitan pyproject pins (and tests/frameworks/ parses it with)."""
    assert CURRENT_VERSION == pinned("torchtitan")
