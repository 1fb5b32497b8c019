"""Data-parallel gradient-reduce overlap as a run sets it (TrainingSpec.overlap_grad_reduce).

Golden values: bridge_recipes.csv's overlap_grad_reduce column, read off NVIDIA-NeMo/Megatron-Bridge
scripts/performance/configs/deepseek/deepseek_llm_pretrain.py@69655bf (H100:
``cfg.comm_overlap.overlap_grad_reduce = False``; B200 / B300 / GB200 / GB300: True),
kimi/kimi_llm_pretrain.py@a4fcff1 (the same split) and the resolved GPT-OSS configs
(scripts/performance/dryrun_configs/gpt_oss/*.yaml@a9497c6: ``ddp.overlap_grad_reduce: true``).
The cost: off -> the gradient reduction is all exposed (cost/dp_comm.py), on -> the fitted
``dp_overlap`` hides part of it, as before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.recipe_overlay import overlay
from meshplan.calib.recipes import parse_recipes, shipped_recipes
from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.errors import MeshplanError
from meshplan.export.import_megatron import import_megatron
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

DSV3_H100 = ("deepseek-v3", "h100-sxm", "fp8", 1024, 16384, 1, 2, 8, 1, 4, 64)
DSV3_GB200 = ("deepseek-v3", "gb200", "fp8", 256, 4096, 1, 1, 4, 1, 4, 64)
KIMI_H100 = ("kimi-k2", "h100-sxm", "bf16", 1024, 8192, 1, 8, 16, 1, 2, 64)
GPT_OSS_B200 = ("gpt-oss-120b", "b200", "bf16", 64, 1280, 4, 1, 1, 1, 1, 64)
LLAMA_GB300 = ("llama3-70b", "gb300", "bf16", 64, 128, 2, 1, 1, 1, 1, 1)


@pytest.mark.parametrize("key, want", [(DSV3_H100, False), (KIMI_H100, False), (DSV3_GB200, True),
                                       (GPT_OSS_B200, True), (LLAMA_GB300, None)])
def test_preset_column_read_off_the_recipe_files(key, want):
    r = shipped_recipes()[key]
    assert r.overlap_grad_reduce is want
    ov = overlay(r, row_zero=None, row_recompute=None)
    assert ov.overlap_grad_reduce is want
    assert any("overlap_grad_reduce: off" in n for n in ov.notes) == (want is False)


def test_bad_cell_is_one_line():
    head = ("model,gpu,precision,num_gpus,global_batch_size,micro_batch_size,tp,pp,cp,vpp,ep,megatron_fsdp,"
            "recompute_num_layers,recompute_modules,cpu_offloading_num_layers,config,source,overlap_grad_reduce\n")
    row = "m,h100-sxm,bf16,8,8,1,1,1,1,1,1,,,,,C,s@1,{}\n"
    assert parse_recipes(head + row.format("0"), "x.csv")[("m", "h100-sxm", "bf16", 8, 8, 1, 1, 1, 1, 1, 1)] \
        .overlap_grad_reduce is False
    with pytest.raises(MeshplanError, match="x.csv line 2: column overlap_grad_reduce: 'yes' is not 0, 1 or blank"):
        parse_recipes(head + row.format("yes"), "x.csv")


def test_training_field_checked_and_kept_through_json():
    t = TrainingSpec(seq_len=4096, global_batch=64, overlap_grad_reduce=False)
    assert TrainingSpec.from_dict(t.to_dict()) == t
    with pytest.raises(MeshplanError, match="overlap_grad_reduce must be true or false"):
        TrainingSpec(seq_len=4096, global_batch=64, overlap_grad_reduce="no")


MODEL = model_preset("llama3-8b")
CLUSTER = system_preset("dgx-h100", num_nodes=4)  # 32 GPUs, the gradients cross nodes


def _step(plan: Plan, *, on: bool, dp_overlap: float):
    calib = calibration_for(CLUSTER.gpu).replace_fields(dp_overlap=dp_overlap)
    t = TrainingSpec(seq_len=4096, global_batch=256, overlap_grad_reduce=on)
    return estimate(MODEL, CLUSTER, t, plan, calib)


@pytest.mark.parametrize("zero", [0, 1])
def test_off_exposes_the_whole_gradient_reduction(zero):
    dims = ParallelDims(dp_replicate=32) if zero == 0 else ParallelDims(dp_shard=32)
    plan = Plan(dims=dims, zero=zero)
    on, off = _step(plan, on=True, dp_overlap=1.0), _step(plan, on=False, dp_overlap=1.0)
    # with the overlap on and dp_overlap 1, the backward (seconds) hides the reduction: the time
    # off is longer by what was hidden, the gradient reduction's total at most
    assert off.step_time_s > on.step_time_s
    # dp_overlap 0: nothing hidden either way (zero 0: the all-reduce is all of it; zero 1: the
    # weights' all-gather keeps its overlap, which is 0 here too)
    assert _step(plan, on=False, dp_overlap=0.0).step_time_s == pytest.approx(
        _step(plan, on=True, dp_overlap=0.0).step_time_s, rel=1e-12)


def test_no_data_parallelism_no_difference():
    plan = Plan(dims=ParallelDims(tp=8, pp=4))
    assert _step(plan, on=False, dp_overlap=1.0).step_time_s == _step(plan, on=True, dp_overlap=1.0).step_time_s


@settings(max_examples=20, deadline=None)
@given(ov=st.floats(0.0, 1.0), dp=st.sampled_from([2, 8, 32]))
def test_off_is_never_faster(ov, dp):
    plan = Plan(dims=ParallelDims(dp_replicate=dp, tp=32 // dp if dp < 32 else 1))
    assert _step(plan, on=False, dp_overlap=ov).step_time_s >= _step(plan, on=True, dp_overlap=ov).step_time_s


ARGS = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
        "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer")


def test_import_reads_megatron_default_off():
    # Megatron-LM's --overlap-grad-reduce is store_true: absent, the reduction runs after the backward
    assert import_megatron(ARGS, num_gpus=8, model=MODEL).training.overlap_grad_reduce is False
    on = import_megatron(ARGS + " --overlap-grad-reduce --overlap-param-gather", num_gpus=8, model=MODEL)
    assert on.training.overlap_grad_reduce is True
    # one GPU: no data parallelism, nothing to overlap: the default stands
    assert import_megatron(ARGS, num_gpus=1, model=MODEL).training.overlap_grad_reduce is True
    with pytest.raises(MeshplanError, match="--overlap-param-gather needs --overlap-grad-reduce"):
        import_megatron(ARGS + " --overlap-param-gather", num_gpus=8, model=MODEL)


def test_bridge_row_takes_the_preset_setting():
    from meshplan.calib.validate import load_runs
    from meshplan.data.published import runs_csv

    runs, _ = load_runs(runs_csv("megatron-bridge"))
    off = [r for r in runs if r.model.name == "deepseek-v3" and r.cluster.gpu.name.startswith("h100")]
    assert off and all(not r.training.overlap_grad_reduce for r in off)
    assert all(any("overlap_grad_reduce: off" in a for a in r.assumed) for r in off)
    assert all(r.training.overlap_grad_reduce for r in runs if r.cluster.gpu.name.startswith(("b200", "gb200")))
    assert replace(off[0].training, overlap_grad_reduce=True) != off[0].training
