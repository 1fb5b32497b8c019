"""The exports write what an MoE plan runs, or refuse it in one line (session 8): the token
dispatcher and a token-drop capacity factor (Megatron-LM ``--moe-token-dispatcher-type``,
``--moe-expert-capacity-factor`` + ``--moe-pad-expert-input-to-capacity``, megatron/training/
arguments.py@000c4ac; Bridge's ``model.moe_*`` TransformerConfig fields), low-precision recipes
Megatron-Bridge 0.3.1 registers no mixed_precision for, and the data schedule (per-bucket CP,
balanced documents) no stack's config has. Before, a token-drop plan exported as dropless and an
fp4 plan as bf16 to Megatron-Bridge, silently."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron_bridge import parse_overrides
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.seqlen import SeqLenDist
from meshplan.spec.training import MoeDispatcher, Precision, Recipe, TrainingSpec

TARGETS = ["megatron", "megatron-bridge", "torchtitan", "deepspeed"]


def _job(model: str = "mixtral-8x7b", gpu: str = "h100-sxm", **training) -> Job:
    return Job(model=model_preset(model), training=TrainingSpec(seq_len=4096, global_batch=64, **training),
               cluster=cluster_for_gpu(gpu, num_nodes=1, gpus_per_node=8),
               plan=Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1))


def _words(text: str) -> list[str]:
    return " ".join(ln.removesuffix("\\") for ln in text.splitlines() if not ln.startswith("#")).split()


@pytest.mark.parametrize("target", TARGETS)
def test_the_dropless_alltoall_plan_exports_everywhere(target):
    """The good form the refusals below change one setting of."""
    export_job(_job(), target)


def test_megatron_writes_the_capacity_padded_and_the_dispatcher():
    words = _words(export_job(_job(moe_capacity_factor=1.25), "megatron").text)
    assert words[words.index("--moe-expert-capacity-factor") + 1] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in words
    # Megatron-LM's default dispatcher is allgather: the plan's alltoall is written
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "alltoall"


def test_megatron_dropless_and_flex():
    words = _words(export_job(_job(moe_dispatcher=MoeDispatcher.FLEX), "megatron").text)
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert "--moe-enable-deepep" in words and "--moe-expert-capacity-factor" not in words


def test_a_dense_model_gets_no_moe_arguments():
    job = Job(model=model_preset("llama3-8b"), training=TrainingSpec(seq_len=4096, global_batch=64),
              cluster=cluster_for_gpu("h100-sxm", num_nodes=1, gpus_per_node=8),
              plan=Plan(dims=ParallelDims(dp_shard=8), zero=1))
    assert not [w for w in _words(export_job(job, "megatron").text) if w.startswith("--moe-")]


@pytest.mark.parametrize("capacity, dispatcher", [(1.25, MoeDispatcher.ALLTOALL), (None, MoeDispatcher.ALLGATHER),
                                                  (2.0, MoeDispatcher.FLEX)])
def test_megatron_import_reads_back_what_the_export_wrote(capacity, dispatcher):
    job = _job(moe_capacity_factor=capacity, moe_dispatcher=dispatcher)
    text = " ".join(_words(export_job(job, "megatron").text))
    back = import_megatron(text, num_gpus=8, model=job.model, name=job.model.name).training
    assert (back.moe_capacity_factor, back.moe_dispatcher) == (capacity, dispatcher)


def test_an_unpadded_capacity_is_refused_on_import():
    job = _job(moe_capacity_factor=1.0)
    text = " ".join(w for w in _words(export_job(job, "megatron").text) if w != "--moe-pad-expert-input-to-capacity")
    with pytest.raises(MeshplanError, match="pad-expert-input-to-capacity"):
        import_megatron(text, num_gpus=8, model=job.model, name=job.model.name)


def test_bridge_writes_the_moe_fields_and_resets_the_recipe_s():
    _, dropping = parse_overrides(export_job(_job(moe_capacity_factor=1.5), "megatron-bridge").text)
    assert (dropping["model.moe_expert_capacity_factor"], dropping["model.moe_pad_expert_input_to_capacity"],
            dropping["model.moe_token_dispatcher_type"]) == ("1.5", "true", "alltoall")
    _, dropless = parse_overrides(export_job(_job(), "megatron-bridge").text)
    assert (dropless["model.moe_expert_capacity_factor"], dropless["model.moe_pad_expert_input_to_capacity"],
            dropless["model.moe_enable_deepep"]) == ("null", "false", "false")


@pytest.mark.parametrize("precision, recipe, gpu", [(Precision.FP8, Recipe.TENSORWISE, "h100-sxm"),
                                                    (Precision.FP8, Recipe.MXFP8, "b200"),
                                                    (Precision.FP4, Recipe.NVFP4, "b200")])
def test_bridge_refuses_a_precision_it_registers_no_recipe_for(precision, recipe, gpu):
    job = _job(gpu=gpu, precision=precision, recipe=recipe)
    assert "--fp8-format" in export_job(job, "megatron").text or "--fp4-format" in export_job(job, "megatron").text
    with pytest.raises(MeshplanError, match="mixed_precision"):
        export_job(job, "megatron-bridge")


def test_bridge_keeps_fp8_delayed():
    _, fields = parse_overrides(export_job(_job(precision=Precision.FP8, recipe=Recipe.DELAYED), "megatron-bridge").text)
    assert fields["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"


def test_bridge_refuses_an_argument_it_has_no_override_for(monkeypatch):
    import meshplan.export.megatron_bridge as bridge

    real = bridge.megatron_args
    monkeypatch.setattr(bridge, "megatron_args", lambda job: (real(job)[0] + [["--moe-new-thing", "1"]], []))
    with pytest.raises(MeshplanError, match="--moe-new-thing"):
        export_job(_job(), "megatron-bridge")


def test_bridge_maps_expert_tensor_parallel():
    job = replace(_job(), plan=Plan(dims=ParallelDims(dp_shard=4, tp=2, ep=4, etp=1), zero=1, sp=True))
    _, fields = parse_overrides(export_job(job, "megatron-bridge").text)
    assert fields["model.expert_tensor_parallel_size"] == "1"


@pytest.mark.parametrize("target, training, says", [
    ("torchtitan", {"moe_capacity_factor": 1.25}, "dropless"),
    ("torchtitan", {"moe_dispatcher": MoeDispatcher.ALLGATHER}, "dispatches"),
    ("torchtitan", {"moe_dispatcher": MoeDispatcher.FLEX}, "dispatches"),
    ("deepspeed", {"moe_dispatcher": MoeDispatcher.FLEX}, "dispatches"),
    ("deepspeed", {"moe_dispatcher": MoeDispatcher.ALLGATHER}, "dispatches"),
])
def test_stacks_refuse_the_routing_they_cannot_run(target, training, says):
    with pytest.raises(MeshplanError, match=says):
        export_job(_job(**training), target)


@pytest.mark.parametrize("capacity, says", [(None, "drop_tokens=False"), (1.25, "capacity_factor=1.25, drop_tokens=True")])
def test_deepspeed_names_the_capacity_in_its_moe_call(capacity, says):
    assert any(says in w for w in export_job(_job(moe_capacity_factor=capacity), "deepspeed").warnings)


DIST = SeqLenDist(lengths=(128, 4096), counts=(40, 6), source="x.csv")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("training, says", [({"seq_len_dist": DIST, "cp_buckets": True}, "per-bucket"),
                                            ({"seq_len_dist": DIST, "doc_balance": "balanced"}, "doc-balance")])
def test_no_stack_runs_the_runtime_s_data_schedule(target, training, says):
    with pytest.raises(MeshplanError, match=says):
        export_job(_job(**training), target)


def test_megatron_runs_the_experts_as_grouped_gemms_once():
    """The cost model prices grouped GEMMs (Calibration.moe_grouped_gemm_*); moe_act recompute needs
    them too, and the flag is written once."""
    from meshplan.plan import Recompute, RecomputeModule

    job = replace(_job(), plan=Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, recompute=Recompute.SELECTIVE,
                                    recompute_modules=(RecomputeModule.MOE_ACT,)))
    assert _words(export_job(job, "megatron").text).count("--moe-grouped-gemm") == 1
    assert _words(export_job(_job(), "megatron").text).count("--moe-grouped-gemm") == 1
