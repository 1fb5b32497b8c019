"""`export --best`: the search is restricted to what the target can run, so the fastest fitting
plan of that restricted space is exported (not a far-down point of the unrestricted frontier)."""

from meshplan.cost.calibration import calibration_for
from dataclasses import replace

from meshplan.export.common import ExportTarget, best_expressible, export_job, search_options_for
from meshplan.plan import Job, Schedule
from meshplan.search.planner import search
from meshplan.spec.cluster import GIB, resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def _job(stack: str | None = None):
    model = model_preset("llama2-7b")
    cluster = resolve_cluster("dgx-a100", nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    res = search(model, cluster, training, calib=calibration_for(cluster.gpu, stack))
    return Job(model=model, training=training, cluster=cluster, plan=res.recommended.plan), res


def test_deepspeed_search_space_holds_only_what_deepspeed_runs():
    job, full = _job()
    res = search(job.model, job.cluster, job.training, options=search_options_for("deepspeed"))
    assert res.frontier
    for p in res.frontier:
        d = p.plan.dims
        assert d.cp == 1 and not p.plan.sp and p.plan.vpp == 1
        assert d.pp == 1 or (p.plan.schedule == Schedule.ONE_F_ONE_B and p.plan.zero <= 1)
    # the recommended point of the restricted search exports as it is
    found = best_expressible(job, res.frontier, ExportTarget.DEEPSPEED, res.budget_bytes / GIB)
    assert found is not None and found[0] == res.recommended_index
    # and a restriction can only cost speed, never gain it
    assert res.recommended.step_time_s >= full.recommended.step_time_s * (1 - 1e-9)


def test_other_targets_search_everything():
    # the same space but for offload, which each stack takes in its own form (issue 17), and
    # torchtitan's experts following the dense tp (no expert tensor parallel degree in 0.3), and
    # Megatron's recompute modules (searched on MoE models); both run the embedding / loss chunks
    assert search_options_for("megatron").embedding_loss_chunks and search_options_for("torchtitan").embedding_loss_chunks
    # Megatron's own restrictions are masks over the same space (its FSDP without replicas or a
    # pipeline, no zero 2, the block recompute method): tests/planner/test_target_frontier_exports.py
    assert (replace(search_options_for("megatron"), offloads=(), offload_layer_counts=False, recompute_module_sets=(),
                    allow=None, allow_split=None)
            == replace(search_options_for("torchtitan"), offloads=(), allow=None, allow_split=None))
    job, _ = _job("megatron")
    export_job(job, "megatron")  # the unrestricted recommendation, as Megatron runs it, is expressible there
