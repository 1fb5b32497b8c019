"""Megatron-Bridge overrides: names checked against Bridge 0.3.1's source, values by Megatron-Core.

Megatron-Bridge cannot be imported on a CPU machine (transformer-engine and CUDA wheels are hard
requirements, and its recipes fetch Hugging Face configs when built), so its own names are
checked against the list vendored from the 0.3.1 wheel's source
(tests/fixtures/frameworks/megatron-bridge-0.3.1.txt). What the overrides set lives in
Megatron-Core dataclasses that Bridge 0.3.1 uses as they are (megatron-core >= 0.15, < 0.17;
installed: 0.16.1): ``model.*`` is a TransformerConfig (Bridge's GPTModelProvider extends it),
``ddp.*`` a DistributedDataParallelConfig, ``dataset.sequence_length`` a GPTDatasetConfig field.
Those are checked by the installed Megatron-Core, and TransformerConfig validates the values.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
import export_cases as cases  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.export import export_job  # noqa: E402
from meshplan.export.megatron_bridge import BRIDGE_VERSION, PLACEHOLDER_RECIPE, parse_overrides  # noqa: E402
from meshplan.plan import Job, Recompute  # noqa: E402
from meshplan.search.planner import search  # noqa: E402
from meshplan.spec.cluster import cluster_for_gpu  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402

VENDORED = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / f"megatron-bridge-{BRIDGE_VERSION}.txt"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
GOLDEN_CASES = ["gpt3_narayanan", "llama70b_hsdp", "llama8b_zero2"]
MCORE_SECTIONS = ("model", "ddp", "dataset")
"""Sections whose fields are Megatron-Core dataclass fields (checked with the installed package)."""


def vendored() -> dict[str, set[str]]:
    """kind -> names: 'section', 'field' (dotted), 'mixed_precision', 'recipe'."""
    out: dict[str, set[str]] = {"section": set(), "field": set(), "mixed_precision": set(), "recipe": set()}
    for ln in VENDORED.read_text().splitlines():
        if not ln.strip() or ln.startswith("#"):
            continue
        kind, _, name = ln.strip().partition(" ")
        if name:
            out[kind].add(name)
        else:
            out["field"].add(kind)
    return out


def _exports() -> list[tuple[Job, str]]:
    out = [(getattr(cases, c)(), (GOLDEN / f"{c}.megatron-bridge.overrides").read_text()) for c in GOLDEN_CASES]
    for model, gpus, batch in (("llama3-8b", 8, 32), ("llama3-70b", 16, 64)):
        cluster = cluster_for_gpu("h100-sxm", num_nodes=gpus // 8, gpus_per_node=8)
        training = TrainingSpec(seq_len=4096, global_batch=batch)
        for p in search(model_preset(model), cluster, training).frontier:
            job = Job(model=model_preset(model), training=training, cluster=cluster, plan=p.plan)
            try:
                out.append((job, export_job(job, "megatron-bridge").text))
            except MeshplanError:
                continue
    return out


EXPORTS = _exports()


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_names_are_bridge_names(i):
    """Runs without any framework: sections, Bridge-own fields, precision recipes and recipe
    functions are those of Megatron-Bridge 0.3.1."""
    names = vendored()
    recipe, fields = parse_overrides(EXPORTS[i][1])
    assert recipe == PLACEHOLDER_RECIPE or recipe in names["recipe"]
    for key, value in fields.items():
        section, _, _ = key.partition(".")
        assert section in names["section"], key
        if section not in MCORE_SECTIONS and key != "mixed_precision":
            assert key in names["field"], key
    assert fields["mixed_precision"] in names["mixed_precision"] | {"null"}


@pytest.fixture(scope="module")
def mcore():
    pytest.importorskip("megatron.core", reason="Megatron-Core not installed: the vendored-name test covers Bridge")
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig, DistributedDataParallelConfig, GPTDatasetConfig


def _value(v: str) -> object:
    """An override's value as Bridge's Hydra-style parser reads it: booleans, null, integers and
    ``[a,b]`` lists (``model.recompute_modules=[core_attn,moe_act]``)."""
    if v.startswith("[") and v.endswith("]"):
        return [_value(x.strip()) for x in v[1:-1].split(",") if x.strip()]
    return {"true": True, "false": False, "null": None}.get(v, int(v) if v.isdigit() else v)


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_megatron_core_takes_the_fields(i, mcore):
    import torch

    transformer_config, ddp_config, dataset_config = mcore
    job, text = EXPORTS[i]
    m, plan, t = job.model, job.full_plan, job.training
    _, fields = parse_overrides(text)
    sections = {s: {k.partition(".")[2]: _value(v) for k, v in fields.items() if k.startswith(s + ".")}
                for s in MCORE_SECTIONS}
    assert set(sections["ddp"]) <= {f.name for f in dataclasses.fields(ddp_config)}
    assert set(sections["dataset"]) <= {f.name for f in dataclasses.fields(dataset_config)}
    model = sections["model"]
    assert model.pop("seq_length") == t.seq_len and "model.seq_length" in vendored()["field"]
    assert set(model) <= {f.name for f in dataclasses.fields(transformer_config)}
    # the recipe supplies the shape; the test gives the job's, and the dtypes Bridge's
    # mixed-precision recipe sets (training/mixed_precision.py: params_dtype, pipeline_dtype)
    dtype = {"bf16_mixed": torch.bfloat16, "fp16_mixed": torch.half,
             "bf16_with_fp8_delayed_scaling_mixed": torch.bfloat16}.get(fields["mixed_precision"], torch.float32)
    c = transformer_config(**model, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
                           params_dtype=dtype, pipeline_dtype=dtype,
                           bf16=dtype == torch.bfloat16, fp16=dtype == torch.half)
    d = plan.dims
    assert (c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.context_parallel_size,
            c.expert_model_parallel_size) == (d.tp, d.pp, d.cp, d.ep)
    assert (c.virtual_pipeline_model_parallel_size or 1) == plan.vpp or c.pipeline_model_parallel_layout
    assert c.sequence_parallel == (plan.sp and d.tp > 1)
    expected = {Recompute.NONE: None, Recompute.FULL: "full", Recompute.SELECTIVE: "selective"}[plan.recompute]
    assert c.recompute_granularity == expected
    assert int(fields["train.global_batch_size"]) == t.global_batch
    assert int(fields["train.micro_batch_size"]) == plan.micro_batch
    sharded = d.dp_shard * d.cp > 1  # Megatron shards over dp x cp (intra_dp_cp_group; export/megatron.py)
    assert sections["ddp"]["use_distributed_optimizer"] == (sharded and plan.zero in (1, 2))
    assert (fields["dist.use_torch_fsdp2"] == "true") == (sharded and plan.zero == 3)
    assert (fields["mixed_precision"] == "fp16_mixed") == (t.precision == Precision.FP16)


def test_bridge_itself_is_not_importable_here_or_agrees():
    """Megatron-Bridge is not installed by the frameworks extra (it cannot run on CPU). Where it
    is installed and imports, its ConfigContainer sections and fields must match the vendored list."""
    try:
        from megatron.bridge.training.config import ConfigContainer, DistributedInitConfig, TrainingConfig
    except Exception:  # noqa: BLE001 - missing CUDA-only dependencies: the vendored list is the check
        return
    names = vendored()
    assert names["section"] <= {f.name for f in dataclasses.fields(ConfigContainer)}
    assert {"micro_batch_size", "global_batch_size"} <= {f.name for f in dataclasses.fields(TrainingConfig)}
    assert "use_torch_fsdp2" in {f.name for f in dataclasses.fields(DistributedInitConfig)}
