"""Megatron pipeline layouts (meshplan.plan.layout), Plan.mtp_stage, the recipes' layouts
(calib/layouts.py, data/bridge_layouts.csv) and what the estimate makes of them.

Golden splits are counted by hand from the layout strings of Megatron-Bridge's DeepSeek-V3 recipe
(src/megatron/bridge/recipes/deepseek/deepseek_v3.py, layout_map) and Megatron-Core's user guide
(features/pipeline_parallel_layout: ``Et*3|(tt|)*29,m|L`` for DeepSeek-V3 on pp16 vpp2)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.layouts import parse_layouts, shipped_layouts
from meshplan.calib.validate import build_run, load_runs
from meshplan.cost import estimate
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import plan_terms, rank_cost
from meshplan.cost.calibration import calibration_for
from meshplan.cost.layer import layer_cost
from meshplan.data.published import runs_csv
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron_bridge import import_megatron_bridge
from meshplan.plan import Job, ParallelDims, Plan, format_layout, parse_layout
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

PP16 = (4,) * 15 + (1,)
"""DeepSeek-V3 on 16 stages (layout_map (16, 1), (8, 2), (4, 4)): E + 4 | 4 x 14 | 1 + m + L."""


# ---- the layout string ---------------------------------------------------------------------
@pytest.mark.parametrize("text,layers,mtp_stage,mtp_layers", [
    ("Et*4|(t*4|)*14tmL", PP16, 15, 1),  # GB300 preset DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1
    ("Et|(tt|)*30mL", (1,) + (2,) * 30 + (0,), 31, 1),  # H100 preset: the last stage MTP + loss only
    ("Et*3|(tt|)*29,m|L", (3,) + (2,) * 29 + (0, 0), 30, 1),  # Megatron-Core guide: MTP a stage of its own
    ("Et*16|t*16|t*16|t*13mL", (16, 16, 16, 13), 3, 1),
    ("Et|(tt|)*30L", (1,) + (2,) * 30 + (0,), None, 0),  # Kimi-K2 H100: no MTP
    ("E t t | t, t | t L", (2, 2, 1), None, 0),  # spaces and commas are cosmetic
    ("E((t|)*2)*2L", (1, 1, 1, 1, 0), None, 0),  # nested groups
    ("Etm*2L", (1,), 0, 2),
])
def test_layouts_read_by_hand(text, layers, mtp_stage, mtp_layers):
    layout = parse_layout(text)
    assert layout.stage_layers == layers and sum(layers) in (61, 5, 4, 1)
    assert layout.mtp_stage == mtp_stage and layout.mtp_layers == mtp_layers


@pytest.mark.parametrize("text,message", [
    ("", "empty"),
    ("Et*4|x|L", "'x' is not a stage separator"),
    ("Et|((tt|)*3L", "is not a stage separator"),
    ("tE|L", "the embedding E must open the first stage"),
    ("Et|EtL", "the embedding E must open the first stage"),
    ("Et|Lt", "the loss L must close the last stage"),
    ("Et*4|", "the last the loss L"),
    ("t|tL", "the first stage must hold the embedding"),
    ("Et|mt|L", "transformer layer after an MTP module"),
    ("Et|m|tL", "transformer layers after the MTP modules"),
    ("Em|m|L", "meshplan places them all on one stage"),
    ("Et*99999999|L", "expands to more than"),
])
def test_malformed_layouts_say_what_is_wrong(text, message):
    with pytest.raises(MeshplanError, match=message):
        parse_layout(text)


@settings(max_examples=200, deadline=None)
@given(middle=st.lists(st.integers(1, 9), max_size=12), first=st.integers(0, 9), last=st.integers(0, 9),
       mtp=st.integers(0, 2), back=st.integers(0, 1))
def test_format_then_parse_is_the_identity(middle, first, last, mtp, back):
    layers = (first, *middle, last)
    # the MTP modules sit on the last stage, or on the one before when the last holds no layer
    mtp_stage = len(layers) - 1 - (back if last == 0 else 0) if mtp else None
    layout = parse_layout(format_layout(layers, mtp_layers=mtp, mtp_stage=mtp_stage))
    assert layout.stage_layers == layers and layout.mtp_layers == mtp
    assert layout.mtp_stage == (mtp_stage if mtp else None)


# ---- the plan ------------------------------------------------------------------------------
def _ds_plan(**kw) -> Plan:
    base = dict(dims=ParallelDims(dp_shard=16, pp=16, ep=8), zero=1, stage_layers=PP16)
    return Plan(**{**base, **kw})


def test_mtp_stage_checks():
    with pytest.raises(MeshplanError, match="is not a virtual stage"):
        _ds_plan(mtp_stage=16)
    with pytest.raises(MeshplanError, match="needs the layer split it sits in"):
        _ds_plan(stage_layers=(), mtp_stage=14)
    with pytest.raises(MeshplanError, match="stages after it hold layers"):
        _ds_plan(mtp_stage=14)
    with pytest.raises(MeshplanError, match="every stage needs at least one layer"):
        _ds_plan(stage_layers=(4,) * 14 + (0, 5))  # an empty middle stage without the MTP modules
    assert _ds_plan(mtp_stage=15).mtp_stage is None  # the last stage is the default: one form
    moved = _ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)  # empty stage holding the MTP
    assert moved.mtp_rank == 14 and _ds_plan().mtp_rank == 15
    assert "mtp=14" in moved.notation() and "mtp=" not in _ds_plan().notation()
    with pytest.raises(MeshplanError, match="has none"):
        replace(moved, dims=ParallelDims(dp_shard=16, pp=16)).validate_for(
            model_preset("llama3-70b"), TrainingSpec(seq_len=4096, global_batch=2048))


def _ds_job(plan: Plan, gpu: str = "b200") -> Job:
    return Job(model=model_preset("deepseek-v3"),
               training=TrainingSpec(seq_len=4096, global_batch=2048, precision=Precision.BF16),
               cluster=cluster_for_gpu(gpu, num_nodes=32), plan=plan)


def test_plan_file_round_trip_and_version_1_still_loads():
    job = _ds_job(_ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14))
    data = json.loads(job.to_json())
    assert data["meshplan_plan_version"] == 3 and data["plan"]["mtp_stage"] == 14
    assert Job.from_dict(data).plan == job.plan
    old = json.loads(_ds_job(_ds_plan()).to_json())
    old["meshplan_plan_version"] = 1
    del old["plan"]["mtp_stage"]  # a version-1 file has no such field
    assert Job.from_dict(old).plan == _ds_plan()
    for bad in (4, True, "2"):
        with pytest.raises(MeshplanError, match="is not supported"):
            Job.from_dict({**old, "meshplan_plan_version": bad})


# ---- the estimate --------------------------------------------------------------------------
def test_mtp_rank_is_charged_one_layer_and_one_head_pass_per_module():
    """rank_cost: the rank holding the MTP module pays its layer and its LM-head pass, by the
    per-layer decomposition (cost/batch.py), wherever the plan puts it."""
    job = _ds_job(_ds_plan())
    arrays = PlanArrays.from_plans([job.full_plan])
    calib = calibration_for(job.cluster.gpu)
    layer = layer_cost(job.model, job.cluster, job.training, arrays, calib)
    terms = plan_terms(job.model, job.cluster, job.training, arrays, calib, layer)
    kw = dict(rank=14, layers=4, recomputed=0, has_embedding=False, has_head=False, terms=terms)
    args = (job.model, job.cluster, job.training, arrays, calib, layer)
    plain, with_mtp = rank_cost(*args, **kw), rank_cost(*args, **kw, has_mtp=True)
    extra = float((with_mtp.compute_s - plain.compute_s)[0])
    want = float((layer.fwd_compute_s + layer.bwd_compute_s)[0] + terms.head_compute_s[0])
    assert job.model.mtp_num_layers == 1 and extra == pytest.approx(want, rel=1e-9)
    assert float(with_mtp.parameters_bytes[0]) > float(plain.parameters_bytes[0])
    # has_mtp defaults to has_head: the last rank as before
    last = rank_cost(*args, **{**kw, "rank": 15, "has_head": True})
    assert float(last.compute_s[0]) == pytest.approx(
        float(rank_cost(*args, **{**kw, "rank": 15, "has_head": True}, has_mtp=True).compute_s[0]))


def test_the_slowest_stage_decides():
    """DeepSeek-V3 on pp16: the even split leaves 3 layers + MTP + two head passes on the last
    rank, which sets the pace; the recipe's layout (4 per rank, 1 + MTP on the last) runs at a
    middle rank's pace, and the step is shorter by the difference per micro-batch."""
    even = estimate(**_kw(_ds_plan(stage_layers=())))
    layout = estimate(**_kw(_ds_plan()))
    t_even = [s.microbatch_time_s for s in even.stages]
    t_layout = [s.microbatch_time_s for s in layout.stages]
    assert int(np.argmax(t_even)) == 15 and int(np.argmax(t_layout)) != 15
    assert t_layout[15] < t_layout[1] and max(t_layout) < max(t_even)
    m = even.time.num_microbatches
    # 1F1B: the step is (m + p - 1) times the slowest rank's micro-batch, plus the per-step tail
    saved = (m + 15) * (max(t_even) - max(t_layout))
    assert even.step_time_s - layout.step_time_s == pytest.approx(saved, rel=0.02)
    moved = estimate(**_kw(_ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)))
    assert int(np.argmax([s.microbatch_time_s for s in moved.stages])) == 14  # 5 layers + MTP there


def _kw(plan: Plan) -> dict:
    job = _ds_job(plan)
    return dict(model=job.model, cluster=job.cluster, training=job.training, plan=plan)


# ---- export and import ---------------------------------------------------------------------
def test_megatron_export_writes_the_split_and_imports_back():
    """Even middle stages on pp16 vpp1: the first/last counts (Megatron keeps the MTP module on
    the last stage); an MTP module on a stage of its own: the layout, with its ``m``."""
    plain = export_job(_ds_job(_ds_plan()), "megatron").text
    assert "--decoder-first-pipeline-num-layers 4" in plain and "--decoder-last-pipeline-num-layers 1" in plain
    moved = _ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)
    text = export_job(_ds_job(moved), "megatron").text
    assert "Et*4|" + "t*4|" * 13 + "t*5m|L" in text
    for plan, exported in ((_ds_plan(), plain), (moved, text)):
        back = import_megatron(exported, num_gpus=256)
        assert back.plan.stage_layers == plan.stage_layers and back.plan.mtp_stage == plan.mtp_stage
    interleaved = _ds_plan(dims=ParallelDims(dp_shard=64, pp=4, ep=64), vpp=4, schedule="interleaved-1f1b")
    text = export_job(_ds_job(interleaved), "megatron").text
    assert "Et*4|" + "t*4|" * 14 + "tmL" in text
    assert import_megatron(text, num_gpus=256).plan.stage_layers == PP16


def test_megatron_bridge_export_round_trip():
    for plan in (_ds_plan(), _ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)):
        job = _ds_job(plan)
        back = import_megatron_bridge(export_job(job, "megatron-bridge").text, num_gpus=256, model=job.model)
        assert back.plan.stage_layers == plan.stage_layers and back.plan.mtp_stage == plan.mtp_stage


def test_megatron_import_checks_the_mtp_count():
    moved = _ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)
    text = export_job(_ds_job(moved), "megatron").text.replace("t*5m|L", "t*5m*2|L")
    with pytest.raises(MeshplanError, match=r"2 MTP module\(s\) \(m\), the model 1"):
        import_megatron(text, num_gpus=256)


def test_torchtitan_refuses_a_moved_mtp_module():
    with pytest.raises(MeshplanError, match="mtp_stage=14 is not expressible"):
        export_job(_ds_job(_ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)), "torchtitan")


# ---- the recipes' layouts on published rows ------------------------------------------------
def test_shipped_layouts_fit_their_models():
    """Every shipped layout covers its preset model's layers and MTP modules exactly."""
    layouts = shipped_layouts()
    assert len(layouts) >= 15
    for (name, pp, vpp), entry in layouts.items():
        model = model_preset(name)
        assert sum(entry.layout.stage_layers) == model.num_layers, name
        assert len(entry.layout.stage_layers) == pp * vpp
        assert entry.layout.mtp_layers == model.mtp_num_layers, name
        assert "@" in entry.source and len(entry.source.split("@")[1]) == 40
    assert layouts[("deepseek-v3", 16, 1)].layout.stage_layers == PP16
    assert layouts[("deepseek-v3", 8, 4)].layout.stage_layers == (1,) + (2,) * 30 + (0,)


@pytest.mark.parametrize("row,message", [
    ("deepseek-v3,4,2,Et*4|(t*4|)*14tmL,x,y@z", "the layout has 16 stages, pp\\*vpp = 8"),
    ("deepseek-v3,16,1,Et*4|q,x,y@z", "line 2: pipeline layout"),
    ("deepseek-v3,0,1,EtL,x,y@z", "column pp: 0 is below 1"),
    ("deepseek-v3,1,1,EtL,,y@z", "column config is blank"),
])
def test_bad_layout_rows_are_named(row, message):
    with pytest.raises(MeshplanError, match=message):
        parse_layouts("model,pp,vpp,pp_layout,config,source\n" + row + "\n", "layouts.csv")


def test_deepseek_bridge_rows_run_the_recipe_layout():
    runs, _ = load_runs(runs_csv("megatron-bridge"))
    ds = [r for r in runs if r.model.name == "deepseek-v3" and r.source.startswith("Megatron-Bridge")]
    pp16 = [r for r in ds if r.plan.dims.pp == 16]
    assert pp16 and all(r.plan.stage_layers == PP16 and r.plan.mtp_stage is None for r in pp16)
    assert all(any(a.startswith("pipeline layout: Et*4|(t*4|)*14tmL") for a in r.assumed) for r in pp16)
    h100 = [r for r in ds if r.plan.dims.pp == 8 and r.plan.vpp == 4]
    assert h100 and all(r.plan.stage_layers[-1] == 0 for r in h100)


def test_a_row_of_another_source_keeps_the_even_split():
    row = {"source": "some paper", "model": "deepseek-v3", "gpu": "b200", "num_gpus": "256",
           "global_batch_size": "2048", "micro_batch_size": "1", "pp": "16", "ep": "8", "seq_len": "4096",
           "precision": "bf16", "measured_tokens_per_s_per_gpu": "1000", "framework": "megatron-core"}
    run = build_run(row)
    assert not any(a.startswith("pipeline layout") for a in run.assumed)
    assert run.plan.stage_layers in ((), tuple(run.plan.with_defaults(run.model).stage_layers))
    assert build_run({**row, "source": "Megatron-Bridge 26.04"}).plan.stage_layers == PP16


def test_the_estimate_says_where_the_mtp_module_runs():
    moved = estimate(**_kw(_ds_plan(stage_layers=(4,) * 14 + (5, 0), mtp_stage=14)))
    assert [s.mtp_modules for s in moved.stages] == [0] * 14 + [1, 0]
    assert moved.to_dict()["stages"][14]["mtp_modules"] == 1
    assert [s.mtp_modules for s in estimate(**_kw(_ds_plan())).stages][-1] == 1


def test_megatron_guide_layout_imports_with_its_own_mtp_stage():
    """Megatron-Core's guide example (DeepSeek-V3, pp16 vpp2): the MTP module alone on virtual
    stage 30 (rank 14), the loss alone on stage 31 (rank 15)."""
    text = export_job(_ds_job(_ds_plan()), "megatron").text
    text = text.replace("--decoder-first-pipeline-num-layers 4", "--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'")
    text = text.replace("--decoder-last-pipeline-num-layers 1", "")
    plan = import_megatron(text, num_gpus=256).plan
    assert plan.vpp == 2 and plan.stage_layers == (3,) + (2,) * 29 + (0, 0)
    assert plan.mtp_stage == 30 and plan.mtp_rank == 14
    est = estimate(**_kw(plan))
    assert est.stages[14].mtp_modules == 1 and est.stages[15].mtp_modules == 0


def test_the_fit_scores_layout_rows_as_estimate_does():
    """calib/fit.py scores rows that ran a recipe's layout rank by rank (cost/split_batch.py), as
    validate's estimate() does; the even-split batch estimate would charge DeepSeek-V3's last rank
    3 layers + MTP + two head passes instead."""
    from meshplan.calib.fit import own_split, predict_all, prepare, row_calibration
    from meshplan.calib.validate import predicted_metric
    from meshplan.cost.split_batch import estimate_split_batch

    runs, _ = load_runs(runs_csv("megatron-bridge"))
    rows = [r for r in runs if own_split(r)]
    assert {r.model.name for r in rows} >= {"deepseek-v3", "kimi-k2", "qwen3-235b-a22b"}
    sample = [r for r in rows if r.model.name == "deepseek-v3"][:6] + [r for r in rows if r.plan.vpp > 1][:4]
    calib = calibration_for(sample[0].cluster.gpu, sample[0].stack)
    fitted, _ = predict_all(prepare(sample), calib)
    for run, got in zip(sample, fitted):
        own = row_calibration(run, calib)  # the row's memory settings and release, as the fit uses
        exact = estimate(run.model, run.cluster, run.training, run.plan, own)
        assert got == pytest.approx(predicted_metric(run, exact.step_time_s), rel=1e-9)
        batch = estimate_split_batch(run.model, run.cluster, run.training, [run.plan], own)
        assert float(batch.peak_memory_bytes[0]) == pytest.approx(exact.peak_memory_gib * 2**30, rel=1e-9)
    with pytest.raises(MeshplanError, match="one pp at a time"):
        estimate_split_batch(sample[0].model, sample[0].cluster, sample[0].training,
                             [_ds_plan(), _ds_plan(dims=ParallelDims(dp_shard=32, pp=8, ep=8), stage_layers=())],
                             calib)
