"""Megatron-Core's own TransformerConfig accepts every Megatron-LM export as the plan says.

Megatron-LM's ``pretrain_gpt.py`` parser lives in megatron/training/arguments.py, which the
megatron-core wheel does not ship; what it does with the arguments is copy every one whose name
is a ``TransformerConfig`` field into that dataclass (``core_transformer_config_from_args``), with
a few renames listed in RENAMES, and let ``TransformerConfig.__post_init__`` validate the
combination (pipeline and virtual stages, recompute method and count, sequence parallel, MoE,
precision). The test does the same with the installed Megatron-Core and compares the fields with
the plan; the argument names themselves are checked against the Megatron-LM list vendored in
tests/fixtures/frameworks/megatron-lm-arguments.txt (which also runs without Megatron-Core).
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
from meshplan.export.import_megatron import import_megatron  # noqa: E402
from meshplan.plan import Job, Offload, ParallelDims, Plan, Recompute, RecomputeModule, Schedule  # noqa: E402
from meshplan.search.planner import search  # noqa: E402
from meshplan.spec.cluster import cluster_for_gpu  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402
from _framework_pins import pinned  # noqa: E402

MEGATRON_CORE_VERSION = pinned("megatron-core")  # pyproject's frameworks extra (tests/_framework_pins.py)
VENDORED = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / "megatron-lm-arguments.txt"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
GOLDEN_CASES = ["gpt3_narayanan", "llama70b_hsdp", "llama8b_zero2"]
# Megatron-LM argument -> TransformerConfig field where the names differ (arguments.py:
# --fp8-format has dest fp8, --disable-bias-linear is store_false into add_bias_linear;
# core_transformer_config_from_args: num_experts, decoder first/last pipeline layers)
RENAMES = {
    "fp8_format": "fp8",
    "num_experts": "num_moe_experts",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}


def megatron_args(text: str) -> dict[str, object]:
    """argparse's namespace for the exported words: --foo-bar V -> foo_bar = V, a flag -> True."""
    lines = [ln.rstrip().removesuffix("\\") for ln in text.splitlines() if not ln.startswith("#")]
    words = shlex.split(" ".join(lines))
    args: dict[str, object] = {}
    for i, w in enumerate(words):
        if not w.startswith("--"):
            continue
        values = []
        for v in words[i + 1:]:
            if v.startswith("--"):
                break
            values.append(int(v) if v.isdigit() else v)
        # a list argument (nargs='*': --recompute-modules core_attn moe_act) keeps its list
        args[w[2:].replace("-", "_")] = True if not values else values[0] if len(values) == 1 else values
    return args


def transformer_config_kwargs(args: dict[str, object]) -> dict[str, object]:
    """What core_transformer_config_from_args hands TransformerConfig for these arguments."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    a = {RENAMES.get(k, k): v for k, v in args.items()}
    if a.pop("disable_bias_linear", False):
        a["add_bias_linear"] = False
    if a.pop("swiglu", False):
        a["gated_linear_unit"], a["activation_func"] = True, F.silu
    if "num_layers_per_virtual_pipeline_stage" in a:  # validate_args
        a["virtual_pipeline_model_parallel_size"] = (
            a["num_layers"] // a.get("pipeline_model_parallel_size", 1) // a.pop("num_layers_per_virtual_pipeline_stage"))
    if not a.get("group_query_attention"):
        a.pop("num_query_groups", None)
    a["params_dtype"] = torch.bfloat16 if a.get("bf16") else (torch.half if a.get("fp16") else torch.float32)
    a["pipeline_dtype"] = a["params_dtype"]
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    return {k: v for k, v in a.items() if k in fields}


def frontier_jobs() -> list[Job]:
    out = []
    for model, gpus, batch in (("llama3-8b", 8, 32), ("llama3-70b", 16, 64)):
        cluster = cluster_for_gpu("h100-sxm", num_nodes=gpus // 8, gpus_per_node=8)
        training = TrainingSpec(seq_len=4096, global_batch=batch)
        res = search(model_preset(model), cluster, training)
        out += [Job(model=model_preset(model), training=training, cluster=cluster, plan=p.plan)
                for p in res.frontier]
    # Megatron-Core's recompute modules and activation offload (--recompute-modules, --cpu-offloading)
    cluster = cluster_for_gpu("h100-sxm", num_nodes=1, gpus_per_node=8)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    moe = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, recompute=Recompute.SELECTIVE,
               recompute_modules=(RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM))
    offload = Plan(dims=ParallelDims(dp_shard=8), zero=1, offload=(Offload.ACTIVATIONS,), offload_layers=8)
    out += [Job(model=model_preset("mixtral-8x7b"), training=training, cluster=cluster, plan=moe),
            Job(model=model_preset("llama3-8b"), training=training, cluster=cluster, plan=offload)]
    return out


def _exports() -> list[tuple[Job, str]]:
    out = [(getattr(cases, c)(), (GOLDEN / f"{c}.megatron.args").read_text()) for c in GOLDEN_CASES]
    for job in frontier_jobs():
        try:
            out.append((job, export_job(job, "megatron").text))
        except MeshplanError:
            continue
    return out


EXPORTS = _exports()


def test_exports_are_not_vacuous():
    assert len(EXPORTS) >= 20


@pytest.fixture(scope="module")
def transformer_config():
    pytest.importorskip("megatron.core", reason="Megatron-Core not installed: the vendored-name test covers it")
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_megatron_core_accepts_the_plan(i, transformer_config):
    job, text = EXPORTS[i]
    plan, t = job.full_plan, job.training
    d = plan.dims
    c = transformer_config(**transformer_config_kwargs(megatron_args(text)))
    assert (c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.context_parallel_size,
            c.expert_model_parallel_size) == (d.tp, d.pp, d.cp, d.ep)
    assert c.sequence_parallel == (plan.sp and d.tp > 1)
    if d.pp > 1 and c.pipeline_model_parallel_layout is None:
        assert (c.virtual_pipeline_model_parallel_size or 1) == plan.vpp
        if c.num_layers_in_first_pipeline_stage is not None:
            assert c.num_layers_in_first_pipeline_stage == plan.stage_layers[0]
            assert c.num_layers_in_last_pipeline_stage == plan.stage_layers[-1]
    expected = {Recompute.NONE: None, Recompute.FULL: "full", Recompute.SELECTIVE: "selective"}[plan.recompute]
    assert c.recompute_granularity == expected
    assert c.bf16 == (t.precision in (Precision.BF16, Precision.FP8)) and c.fp16 == (t.precision == Precision.FP16)
    assert (c.fp8 is not None) == (t.precision == Precision.FP8)
    args = megatron_args(text)
    assert args["micro_batch_size"] == plan.micro_batch and args["global_batch_size"] == t.global_batch
    # and meshplan's own import gives the plan back (round trip)
    back = import_megatron(text, num_gpus=job.cluster.num_gpus).plan.with_defaults(job.model)
    assert back.dims.tp == d.tp and back.dims.pp == d.pp and back.dims.dp == d.dp
    assert back.stage_layers == plan.stage_layers and back.recompute_layers == plan.recompute_layers
    assert back.schedule == plan.schedule or d.pp == 1 or plan.schedule in (Schedule.GPIPE, Schedule.INTERLEAVED_1F1B)


def vendored_flags() -> set[str]:
    return {ln.strip() for ln in VENDORED.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_flags_are_megatron_lm_arguments(i):
    """Runs without Megatron: every flag written is a Megatron-LM argument."""
    for name in megatron_args(EXPORTS[i][1]):
        assert "--" + name.replace("_", "-") in vendored_flags(), name


def test_installed_version(transformer_config):
    import importlib.metadata

    assert importlib.metadata.version("megatron-core") == MEGATRON_CORE_VERSION
