"""The allocator setting meshplan's launcher gives every rank (meshplan/launch_env.py) is the one
the memory model's meshplan stack assumes, and the one the exported launch lines print."""

from __future__ import annotations

import pytest

from meshplan.cost.calibration import calibration_for
from meshplan.export import ExportTarget, export_job
from meshplan.export.import_torchtitan_cli import parse_command_line
from meshplan.export.megatron_bridge import parse_overrides
from meshplan.launch_env import (
    ALLOC_CONF_ENV,
    EXPANDABLE_SEGMENTS,
    launcher_env,
    sets_expandable_segments,
    with_launcher_env,
)
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.runtime.launch import _worker_env
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

H100 = system_preset("dgx-h100", 1)


@pytest.mark.parametrize("conf, on", [
    ("expandable_segments:True", True),
    ("max_split_size_mb:512,expandable_segments:True", True),
    ("expandable_segments:True,expandable_segments:False", False),  # the last one wins, as torch parses it
    ("expandable_segments:False", False),
    ("max_split_size_mb:512", False),
    ("", False),
])
def test_reads_the_allocator_setting(conf, on):
    assert sets_expandable_segments({ALLOC_CONF_ENV: conf}) is on


def test_the_launcher_sets_it_and_keeps_a_users_own_value(monkeypatch):
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    assert _worker_env()[ALLOC_CONF_ENV] == EXPANDABLE_SEGMENTS
    monkeypatch.setenv(ALLOC_CONF_ENV, "max_split_size_mb:256")
    assert _worker_env()[ALLOC_CONF_ENV] == "max_split_size_mb:256"
    assert with_launcher_env({}) == launcher_env()


def test_the_meshplan_stack_assumes_what_its_launcher_sets():
    calib = calibration_for(H100.gpu, "meshplan")
    assert calib.allocator_expandable_segments is sets_expandable_segments(launcher_env()) is True
    # published Megatron rows ran the allocator's default unless their release entry says otherwise
    assert calibration_for(H100.gpu, "megatron").allocator_expandable_segments is False


def _job() -> Job:
    plan = Plan(dims=ParallelDims(dp_shard=2, tp=4), zero=1, micro_batch=1)
    return Job(model=model_preset("llama3-8b"), cluster=H100,
               training=TrainingSpec(seq_len=4096, global_batch=16, precision="bf16"), plan=plan)


def test_exports_print_the_launchers_environment():
    job = _job()
    setting = f"{ALLOC_CONF_ENV}={EXPANDABLE_SEGMENTS}"
    megatron = export_job(job, ExportTarget.MEGATRON).text
    assert f"# launch: {setting} torchrun" in megatron
    bridge = export_job(job, ExportTarget.MEGATRON_BRIDGE).text
    assert setting in bridge
    assert parse_overrides(bridge)[1]["model.tensor_model_parallel_size"] == "4"  # still parses
    titan = export_job(job, ExportTarget.TORCHTITAN, version="0.3.0").text
    command = next(line for line in titan.splitlines() if "torchrun" in line)
    assert command.startswith(f"{setting} torchrun")
    assert parse_command_line(titan).cfg["parallelism"]["tensor_parallel_degree"] == 4  # still parses
