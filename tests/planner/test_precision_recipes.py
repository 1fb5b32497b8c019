"""fp8 recipes and fp4 as training options: validation, JSON, GEMM peak, exports (issue 13.2)."""

import json
from dataclasses import replace

import pytest

from meshplan.cost import estimate
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron import megatron_args
from meshplan.export.torchtitan import torchtitan_sections
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, Recipe, TrainingSpec


def test_recipe_defaults_and_mismatches():
    assert TrainingSpec(seq_len=8, global_batch=1, precision="fp8").recipe == Recipe.DELAYED
    assert TrainingSpec(seq_len=8, global_batch=1, precision="fp4").recipe == Recipe.NVFP4
    assert TrainingSpec(seq_len=8, global_batch=1).recipe is None
    assert TrainingSpec(seq_len=8, global_batch=1, precision="fp8", recipe="mxfp8").recipe == Recipe.MXFP8
    with pytest.raises(MeshplanError, match="needs precision fp8 or fp4, not bf16"):
        TrainingSpec(seq_len=8, global_batch=1, recipe="tensorwise")
    with pytest.raises(MeshplanError, match="not an fp4 recipe; fp4 takes nvfp4, mxfp4"):
        TrainingSpec(seq_len=8, global_batch=1, precision="fp4", recipe="rowwise")
    with pytest.raises(MeshplanError, match="is not one of"):
        TrainingSpec(seq_len=8, global_batch=1, precision="fp8", recipe="per-channel")


def test_training_json_roundtrip_and_old_files():
    t = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.FP8, recipe=Recipe.BLOCKWISE)
    assert TrainingSpec.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    old = {"seq_len": 4096, "global_batch": 64, "precision": "fp8", "optimizer": "adamw"}  # no recipe
    assert TrainingSpec.from_dict(old).recipe == Recipe.DELAYED
    with pytest.raises(MeshplanError):
        TrainingSpec.from_dict({**old, "recipe": "bogus"})


def _job(precision, recipe=None, system="gb200-nvl72", nodes=16):
    return Job(model=model_preset("llama3-70b"),
               training=TrainingSpec(seq_len=8192, global_batch=64, precision=precision, recipe=recipe),
               cluster=system_preset(system, num_nodes=nodes),
               plan=Plan(dims=ParallelDims(tp=4, pp=4, dp_shard=4), zero=1, sp=True))


def test_fp4_gemms_run_at_the_fp4_peak():
    """Same plan, fp8 vs fp4 on GB200 (5 vs 10 PFLOP/s dense): the GEMM-bound compute time
    shrinks, by less than half: fp4 GEMMs reach a lower fraction of their peak
    (Calibration.fp4_matmul_factor), the first and last layers stay bf16, and memory-bound work,
    casts and the bf16 attention core do not speed up (cost/precision.py)."""
    f8, f4 = (estimate(j.model, j.cluster, j.training, j.plan) for j in (_job("fp8", "mxfp8"), _job("fp4")))
    assert f4.time.compute_s < 0.85 * f8.time.compute_s
    assert f4.time.compute_s > 0.5 * f8.time.compute_s
    bf = _job("bf16")
    b = estimate(bf.model, bf.cluster, bf.training, bf.plan)
    assert b.time.compute_s > 1.3 * f8.time.compute_s


def test_recipes_need_the_gpus_tensor_cores():
    for prec, recipe in (("fp4", None), ("fp8", "mxfp8"), ("fp4", "mxfp4")):
        j = _job(prec, recipe, system="dgx-h100", nodes=8)
        with pytest.raises(MeshplanError, match="h100-sxm"):
            estimate(j.model, j.cluster, j.training, j.plan)
    ok = _job("fp8", "blockwise", system="dgx-h100", nodes=8)  # per-block scales in software: Hopper runs it
    assert estimate(ok.model, ok.cluster, ok.training, ok.plan).step_time_s > 0
    amd = _job("fp4", "mxfp4", system="mi355x-8", nodes=8)
    assert estimate(amd.model, amd.cluster, amd.training, amd.plan).step_time_s > 0
    with pytest.raises(MeshplanError, match="no nvfp4 tensor cores"):
        nv = _job("fp4", "nvfp4", system="mi355x-8", nodes=8)
        estimate(nv.model, nv.cluster, nv.training, nv.plan)


def test_job_file_carries_the_recipe(tmp_path):
    j = _job("fp8", "tensorwise")
    j.save(tmp_path / "p.json")
    assert Job.load(tmp_path / "p.json").training.recipe == Recipe.TENSORWISE


def _flags(job) -> str:
    return " ".join(" ".join(a) for a in megatron_args(job)[0])


def test_megatron_export_and_import_of_recipes():
    assert "--bf16 --fp8-format hybrid --fp8-recipe mxfp8" in _flags(_job("fp8", "mxfp8"))
    f = _flags(_job("fp4"))
    assert "--bf16 --fp4-format e2m1 --fp4-recipe nvfp4" in f and "--fp8-format" not in f
    for recipe in ("rowwise", "mxfp4"):
        with pytest.raises(MeshplanError, match=f"Megatron-Core has no {recipe} recipe"):
            megatron_args(_job("fp8" if recipe == "rowwise" else "fp4", recipe))
    for prec, recipe in (("fp8", "blockwise"), ("fp8", "delayed"), ("fp4", "nvfp4")):
        job = _job(prec, recipe)
        back = import_megatron(export_job(job, "megatron").text, num_gpus=job.cluster.num_gpus)
        assert back.training.precision == Precision(prec) and back.training.recipe == Recipe(recipe)
    plain = import_megatron("--fp8-format hybrid --bf16 --seq-length 8 --global-batch-size 8", num_gpus=8)
    assert plain.training.recipe == Recipe.DELAYED  # Megatron's default --fp8-recipe


def test_torchtitan_and_deepspeed_exports():
    s, w = torchtitan_sections(_job("fp8", "rowwise"))
    assert s["model"]["converters"] == ["float8"] and s["float8"]["recipe_name"] == "rowwise" and w
    s, _ = torchtitan_sections(_job("fp8", "mxfp8"))
    assert s["model"]["converters"] == ["mx"] and s["mx"]["recipe_name"] == "mxfp8"
    with pytest.raises(MeshplanError, match="no delayed fp8 recipe"):
        torchtitan_sections(_job("fp8"))
    with pytest.raises(MeshplanError, match="no fp4"):
        torchtitan_sections(_job("fp4"))
    with pytest.raises(MeshplanError, match="no fp4 training switch"):
        export_job(_job("fp4"), "deepspeed")


def test_runtime_refuses_what_it_cannot_run():
    from meshplan.runtime.support import check_runnable

    j = _job("bf16")
    moe = replace(j, model=model_preset("mixtral-8x7b"),
                  plan=Plan(dims=ParallelDims(tp=4, pp=4, dp_shard=4, ep=8, etp=1), zero=1))
    with pytest.raises(MeshplanError, match="etp=1 different from tp=4"):
        check_runnable(moe)
