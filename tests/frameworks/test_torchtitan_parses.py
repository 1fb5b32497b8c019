"""torchtitan's own parser reads every torchtitan export as the plan says.

With torchtitan installed (the ``frameworks`` extra, as CI installs it) each golden command line
and the export of every frontier point of a few jobs goes through
``torchtitan.config.ConfigManager().parse_args``, the function ``python -m torchtitan.train``
calls; the parsed degrees, batch sizes, schedule, pipeline split, checkpointing and precision are
compared with the plan's. Without torchtitan the same exports are checked against the option
names vendored from torchtitan 0.3.0 (tests/fixtures/frameworks/torchtitan-0.3.0.txt), so the
names never go unchecked.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
import export_cases as cases  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.export import export_job  # noqa: E402
from meshplan.export.common import search_options_for  # noqa: E402
from meshplan.export.import_torchtitan import import_torchtitan  # noqa: E402
from meshplan.export.import_torchtitan_cli import parse_command_line  # noqa: E402
from meshplan.export.torchtitan import SCHEDULE_NAMES  # noqa: E402
from meshplan.export.torchtitan_cli import (CURRENT_VERSION, PLACEHOLDER_CONFIG,  # noqa: E402
                                            PLACEHOLDER_MODULE, stage_modules)
from meshplan.plan import Job, Recompute  # noqa: E402
from meshplan.search.planner import search  # noqa: E402
from meshplan.spec.cluster import cluster_for_gpu, system_preset  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
VENDORED = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / f"torchtitan-{CURRENT_VERSION}.txt"
CASES = ["gpt3_narayanan", "llama70b_hsdp", "llama8b_zero2", "mixtral_ep"]
STAND_IN = ("llama3", "llama3_debugmodel")
"""Config function that stands in for a model torchtitan has no entry for: the overrides under
test (degrees, batch, schedule, split, checkpointing, precision) do not depend on it."""
AC_CLASS = {"full": "FullAC", "selective": "SelectiveAC"}


def argv(text: str) -> list[str]:
    """The words after ``-m torchtitan.train``, placeholders replaced by the stand-in."""
    lines = [ln.rstrip().removesuffix("\\") for ln in text.splitlines() if not ln.startswith("#")]
    words = shlex.split(" ".join(lines))
    words = words[words.index("--module"):]
    return [{PLACEHOLDER_MODULE: STAND_IN[0], PLACEHOLDER_CONFIG: STAND_IN[1]}.get(w, w) for w in words]


def frontier_jobs() -> list[Job]:
    """Every frontier point of three searches of the space torchtitan can express at all: the README's example (Llama-3-8B on 2 DGX H100
    nodes, seq 8192, batch 64), a dense one with pipeline room, and an MoE one."""
    out = []
    for model, cluster, seq, batch in (
            ("llama3-8b", system_preset("dgx-h100", num_nodes=2), 8192, 64),
            ("llama3-70b", cluster_for_gpu("h100-sxm", num_nodes=2, gpus_per_node=8), 4096, 64),
            ("mixtral-8x7b", cluster_for_gpu("h100-sxm", num_nodes=2, gpus_per_node=8), 4096, 32)):
        training = TrainingSpec(seq_len=seq, global_batch=batch)
        res = search(model_preset(model), cluster, training, options=search_options_for("torchtitan"))
        out += [Job(model=model_preset(model), training=training, cluster=cluster, plan=p.plan)
                for p in res.frontier]
    return out


FRONTIER = frontier_jobs()


def expressible(jobs: list[Job]) -> list[tuple[Job, str]]:
    out = []
    for job in jobs:
        try:
            out.append((job, export_job(job, "torchtitan", CURRENT_VERSION).text))
        except MeshplanError:
            continue
    return out


FRONTIER_EXPORTS = expressible(FRONTIER)


def test_frontier_points_mostly_expressible():
    """The frontier checks below are not vacuous. (Points refused: mostly recompute of some layers
    only, which torchtitan 0.3 cannot express.)"""
    assert len(FRONTIER) >= 10 and len(FRONTIER_EXPORTS) >= len(FRONTIER) // 3


def test_frontier_never_refused_for_its_sharding():
    """The torchtitan search keeps only what torchtitan shards as planned: FSDP over dp_shard x cp
    whenever cp > 1 (search_options_for's mask agrees with the exporter)."""
    for job in FRONTIER:
        try:
            export_job(job, "torchtitan", CURRENT_VERSION)
        except MeshplanError as e:
            assert "FSDP" not in str(e), str(e)


def _assert_parsed_equals_plan(cfg, job: Job) -> None:
    plan = job.full_plan
    d, t, par, tr = plan.dims, job.training, cfg.parallelism, cfg.training
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree, par.tensor_parallel_degree,
            par.pipeline_parallel_degree, par.context_parallel_degree, par.expert_parallel_degree) == \
        (d.dp_replicate, d.dp_shard, d.tp, d.pp, d.cp, d.ep)
    assert tr.seq_len == t.seq_len and tr.global_batch_size == t.global_batch
    # local batch: the rank's micro-batch (pp = 1, torchtitan accumulates) or its step share (pp > 1)
    assert tr.local_batch_size == (t.global_batch // d.dp if d.pp > 1 else plan.micro_batch)
    if d.dp_shard * d.cp > 1:  # torchtitan's FSDP shards over dp_shard x cp (ParallelDims.fsdp_enabled)
        assert par.fsdp_reshard_after_forward == ("always" if plan.zero == 3 else "never")
    if d.pp > 1:
        from torch.distributed.pipelining.schedules import get_schedule_class

        assert get_schedule_class(par.pipeline_parallel_schedule).__name__.lower() == \
            get_schedule_class(SCHEDULE_NAMES[plan.schedule]).__name__.lower()
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch
        assert par.module_fqns_per_model_part == stage_modules(plan.stage_layers)
        assert len(par.module_fqns_per_model_part) == d.pp * plan.vpp
    assert tr.mixed_precision_param == ("float32" if t.precision == Precision.FP32 else "bfloat16")
    ac = cfg.activation_checkpoint
    if plan.recompute == Recompute.NONE:
        assert ac is None
    else:
        assert type(ac).__qualname__ == AC_CLASS[plan.recompute.value] + ".Config"


@pytest.fixture(scope="module")
def config_manager():
    pytest.importorskip("torchtitan", reason="torchtitan not installed: the vendored-name tests cover it")
    pytest.importorskip("triton", reason="torchtitan's model registries import triton")
    from torchtitan.config import ConfigManager

    return ConfigManager


@pytest.mark.parametrize("case", CASES)
def test_golden_command_line_parses(case, config_manager):
    text = (GOLDEN / f"{case}.torchtitan-{CURRENT_VERSION}.sh").read_text()
    cfg = config_manager().parse_args(argv(text))
    _assert_parsed_equals_plan(cfg, getattr(cases, case)())


def signature(job: Job) -> tuple:
    """The choices an export spells differently: one frontier point of each goes to torchtitan."""
    p = job.full_plan
    d = p.dims
    return (d.dp_replicate > 1, d.dp_shard > 1, p.zero, d.tp > 1, d.pp > 1, p.vpp > 1, d.cp > 1, d.ep > 1,
            p.recompute, p.schedule if d.pp > 1 else None, job.model.name)


def distinct(exports: list[tuple[Job, str]]) -> list[tuple[Job, str]]:
    seen: dict[tuple, tuple[Job, str]] = {}
    for job, text in exports:
        seen.setdefault(signature(job), (job, text))
    return list(seen.values())


def test_frontier_exports_parse(config_manager):
    """One frontier point of every kind (degrees present, ZeRO stage, recompute, schedule, model)
    is read by torchtitan as planned (each parse takes about a second: not all 150)."""
    chosen = distinct(FRONTIER_EXPORTS)
    assert len(chosen) >= 10
    for job, text in chosen:
        _assert_parsed_equals_plan(config_manager().parse_args(argv(text)), job)


def test_every_frontier_export_round_trips():
    """Runs without torchtitan: meshplan's import of every frontier export gives the plan back."""
    for job, text in FRONTIER_EXPORTS:
        back = import_torchtitan(parse_command_line(text).cfg, num_gpus=job.cluster.num_gpus,
                                 num_layers=job.model.num_layers).plan.with_defaults(job.model)
        p = job.full_plan
        assert back.dims == p.dims and back.micro_batch == p.micro_batch and back.vpp == p.vpp
        assert back.recompute == p.recompute and back.stage_layers == p.stage_layers
        assert back.schedule == p.schedule or p.dims.pp == 1
        # FSDP over dp_shard x cp; warned: ZeRO-1 -> 2
        assert back.zero == (0 if p.dims.dp_shard * p.dims.cp == 1 else 2 if p.zero == 1 else p.zero)


def test_vendored_names_match_installed(config_manager):
    """The vendored list is exactly the installed version's fields (regenerate it on upgrade)."""
    import importlib.metadata

    from torchtitan.config import ParallelismConfig, TrainingConfig

    assert importlib.metadata.version("torchtitan") == CURRENT_VERSION
    installed = {f"{s}.{f.name}" for s, c in (("training", TrainingConfig), ("parallelism", ParallelismConfig))
                 for f in dataclasses.fields(c)}
    assert installed == {n for n in vendored_names() if not n.startswith("activation_checkpoint:")}


def vendored_names() -> set[str]:
    return {ln.strip() for ln in VENDORED.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


@pytest.mark.parametrize("text", [(GOLDEN / f"{c}.torchtitan-{CURRENT_VERSION}.sh").read_text() for c in CASES]
                         + [t for _, t in FRONTIER_EXPORTS])
def test_options_are_torchtitan_names(text):
    """Runs without torchtitan: every option written is a field of torchtitan 0.3.0."""
    names = vendored_names()
    for w in argv(text):
        if w.startswith("--") and w not in ("--module", "--config"):
            assert w[2:] in names, w
        elif w.startswith("activation_checkpoint:"):
            assert w in names, w
