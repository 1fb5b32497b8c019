"""The embedding / loss split (``plan.embedding_loss_split``) exports as Megatron-LM's
``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`` (Megatron-Bridge:
``model.account_for_*_in_pipeline_split``) and imports back to the same plan."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings, strategies as st

from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron_bridge import bridge_overrides, import_megatron_bridge
from meshplan.plan import Job, ParallelDims, Plan, Recompute, Schedule, embedding_loss_split, even_split
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"
LLAMA405 = model_preset("llama3.1-405b")


def job_405b() -> Job:
    """Megatron-Bridge's Llama 3.1 405B layout (rows 322/360/...): tp4 pp16 vpp8, 126 layers + E + L."""
    plan = Plan(dims=ParallelDims(dp_shard=4, tp=4, pp=16), zero=1, sp=True, schedule=Schedule.INTERLEAVED_1F1B,
                vpp=8, micro_batch=1, stage_layers=(0,) + (1,) * 126 + (0,))
    return Job(model=LLAMA405, training=TrainingSpec(seq_len=8192, global_batch=1536, precision=Precision.BF16),
               cluster=cluster_for_gpu("gb200").with_gpus(256), plan=plan)


def test_megatron_flags_golden():
    text = export_job(job_405b(), "megatron").text
    # one layer per virtual stage counting the slots: (126 + 2) / (16 * 8) = 1
    assert "--account-for-embedding-in-pipeline-split \\" in text
    assert "--account-for-loss-in-pipeline-split \\" in text
    assert "--num-layers-per-virtual-pipeline-stage 1 \\" in text
    assert "--pipeline-model-parallel-layout" not in text
    back = import_megatron(text, num_gpus=256)
    assert back.plan.stage_layers == embedding_loss_split(126, 128)
    assert back.plan.with_defaults(LLAMA405) == job_405b().plan.with_defaults(LLAMA405)


def test_bridge_overrides_golden():
    fields = dict(bridge_overrides(job_405b())[0])
    assert fields["model.account_for_embedding_in_pipeline_split"] == "true"
    assert fields["model.account_for_loss_in_pipeline_split"] == "true"
    assert fields["model.virtual_pipeline_model_parallel_size"] == "8"  # the recipe's vpp, not 126 // 16 // 1
    back = import_megatron_bridge(export_job(job_405b(), "megatron-bridge").text, num_gpus=256, model=LLAMA405)
    assert back.plan.with_defaults(LLAMA405) == job_405b().plan.with_defaults(LLAMA405)
    # a plan without the split writes both fields false (a recipe's own true would apply otherwise)
    even = replace(job_405b(), plan=replace(job_405b().plan, vpp=1, stage_layers=(), schedule=Schedule.ONE_F_ONE_B,
                                            dims=replace(job_405b().plan.dims, pp=2, dp_shard=32)))
    assert dict(bridge_overrides(even)[0])["model.account_for_loss_in_pipeline_split"] == "false"


@st.composite
def layouts(draw):
    layers = draw(st.integers(2, 40))
    slots = layers + 2
    pp = draw(st.sampled_from([d for d in (2, 4, 8) if slots % d == 0] or [0]))
    assume(pp)
    vpp = draw(st.sampled_from([v for v in range(2, slots // pp + 1) if (slots // pp) % v == 0] or [0]))
    assume(vpp)
    split = embedding_loss_split(layers, pp * vpp)
    assume(pp * vpp > layers or split != even_split(layers, pp * vpp))
    model = replace(model_preset("llama3-8b"), num_layers=layers)
    recompute = draw(st.sampled_from([Recompute.NONE, Recompute.SELECTIVE]))
    plan = Plan(dims=ParallelDims(dp_shard=2, tp=2, pp=pp), zero=1, sp=True, schedule=Schedule.INTERLEAVED_1F1B,
                vpp=vpp, micro_batch=1, stage_layers=split, recompute=recompute)
    return Job(model=model, training=TrainingSpec(seq_len=4096, global_batch=8 * pp, precision=Precision.BF16),
               cluster=cluster_for_gpu("h100-sxm", gpus_per_node=8).with_gpus(4 * pp), plan=plan)


@settings(max_examples=30, deadline=None)
@given(layouts())
def test_roundtrip_megatron_and_bridge(job):
    want = job.plan.with_defaults(job.model)
    text = export_job(job, "megatron").text
    assert "--account-for-embedding-in-pipeline-split" in text
    assert import_megatron(text, num_gpus=job.cluster.num_gpus, model=job.model).plan.with_defaults(job.model) == want
    back = import_megatron_bridge(export_job(job, "megatron-bridge").text, num_gpus=job.cluster.num_gpus,
                                  model=job.model)
    assert back.plan.with_defaults(job.model) == want


def test_first_last_counts_without_interleaving_unchanged():
    """pp16 without virtual stages: the embedding / loss split (7, 8 x 14, 7) stays the
    --decoder-first/last-pipeline-num-layers form it always had."""
    job = replace(job_405b(), plan=replace(job_405b().plan, schedule=Schedule.ONE_F_ONE_B, vpp=1,
                                           stage_layers=embedding_loss_split(126, 16)))
    text = export_job(job, "megatron").text
    assert "--decoder-first-pipeline-num-layers 7" in text and "--account-for" not in text


@pytest.mark.parametrize("extra,msg", [
    ("--account-for-embedding-in-pipeline-split", "without the other is not imported"),
    ("--account-for-loss-in-pipeline-split", "without the other is not imported"),
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--pipeline-model-parallel-layout 'Et|t|t|tL'", "give one or the other"),
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--num-layers-per-virtual-pipeline-stage 2", "6 layers over pp=2 do not split into virtual stages of 2"),
])
def test_import_refuses(extra, msg):
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --global-batch-size 8 "
            "--pipeline-model-parallel-size 2 --micro-batch-size 1 ")
    with pytest.raises(MeshplanError, match=msg):
        import_megatron(base + extra, num_gpus=2, vocab_default=1000)


def test_cli_import_reads_the_flags():
    args = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 16 --sequence-parallel "
            "--use-distributed-optimizer --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split --num-layers-per-virtual-pipeline-stage 1 "
            "--micro-batch-size 1 --global-batch-size 1536 --seq-length 8192 --bf16")
    r = subprocess.run([sys.executable, "-m", "meshplan", "import", "--from", "megatron", args, "--gpu", "gb200",
                        "--gpus", "256", "--model", "llama3.1-405b", "--json"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 0, r.stderr
    assert "pp16(interleaved-1f1b,v8)" in r.stdout and "layers=0,1x126,0" in r.stdout


def test_torchtitan_roundtrip():
    """torchtitan >= 0.3 writes the parts (``tok_embeddings`` alone first, the head alone last) and
    reads them back as the same split."""
    from meshplan.export.import_torchtitan import import_torchtitan
    from meshplan.export.import_torchtitan_cli import parse_command_line

    job = job_405b()
    back = import_torchtitan(parse_command_line(export_job(job, "torchtitan", "0.3.0").text).cfg, num_gpus=256,
                             num_layers=126)
    assert back.plan.stage_layers == embedding_loss_split(126, 128)
    assert back.plan.vpp == 8 and back.plan.dims.pp == 16
