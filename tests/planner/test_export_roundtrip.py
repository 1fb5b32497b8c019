"""Export then import gives the same plan wherever the target can express it.

A hypothesis search over random valid plans: each export either refuses with MeshplanError or,
imported back, gives the original plan up to the mappings the exporter states as warnings
(normalise() applies exactly those).
"""

import tomllib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import export_cases as cases
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.import_megatron import import_megatron
from meshplan.export.megatron_bridge import import_megatron_bridge
from meshplan.export.import_torchtitan import import_torchtitan
from meshplan.export.import_torchtitan_cli import parse_command_line
from meshplan.plan import CPMethod, Job, ParallelDims, Plan, Recompute, Schedule
from meshplan.spec.cluster import cluster_for_gpu
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

MODEL = model_preset("llama3-8b")  # 32 layers, 32 heads, 8 KV heads


@st.composite
def jobs(draw):
    dims = ParallelDims(
        dp_replicate=draw(st.sampled_from([1, 2])), dp_shard=draw(st.sampled_from([1, 2, 4])),
        tp=draw(st.sampled_from([1, 2, 4])), pp=draw(st.sampled_from([1, 2, 4])),
        cp=draw(st.sampled_from([1, 2])),
    )
    # with dp_shard 1 every stage too: ZeRO over cp alone, or over one rank (Megatron's distributed
    # optimizer with one-rank instances); each target exports it exactly or refuses it
    zero = draw(st.sampled_from([1, 2, 3])) if dims.dp_shard > 1 else draw(st.sampled_from([0, 1, 2, 3]))
    schedule = draw(st.sampled_from(list(Schedule)))
    vpp = draw(st.sampled_from([1, 2])) if schedule.supports_virtual_stages and dims.pp > 1 else 1
    n_stages = dims.pp * vpp
    if draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, MODEL.num_layers - 1), min_size=n_stages - 1,
                                   max_size=n_stages - 1)))
        bounds = [0, *cuts, MODEL.num_layers]
        layers = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    else:
        layers = ()
    recompute = draw(st.sampled_from(list(Recompute)))
    rec = ()
    if recompute != Recompute.NONE and layers and draw(st.booleans()):
        rec = tuple(draw(st.integers(0, n)) for n in layers)
    precision = draw(st.sampled_from([Precision.BF16, Precision.FP16, Precision.FP8]))
    plan = Plan(dims=dims, zero=zero, sp=dims.tp > 1 and draw(st.booleans()), schedule=schedule,
                vpp=vpp, stage_layers=layers, cp_method=draw(st.sampled_from(list(CPMethod))),
                micro_batch=draw(st.sampled_from([1, 2])), recompute=recompute, recompute_layers=rec)
    cluster = cluster_for_gpu("h100-sxm", gpus_per_node=dims.world_size)
    try:
        return Job(model=MODEL, training=TrainingSpec(seq_len=4096, global_batch=64, precision=precision),
                   cluster=cluster, plan=plan)
    except MeshplanError:
        assume(False)


def _canonical(job: Job, plan: Plan) -> Plan:
    """The plan with its defaults filled and the choices that mean nothing at its degrees (a
    schedule without pipeline, a CP method without CP) at their defaults. The ZeRO stage is kept
    whatever dp_shard x cp: every target shards over dp_shard x cp (Megatron-LM, torchtitan) or
    over every data-parallel rank (DeepSpeed), and ZeRO over one rank is exported as such or refused."""
    p = plan.with_defaults(job.model)
    d = p.dims
    return replace(
        p,
        schedule=p.schedule if d.pp > 1 else Schedule.ONE_F_ONE_B,
        cp_method=p.cp_method if d.cp > 1 else CPMethod.RING,
    )


_canonical_megatron = _canonical


def normalise_megatron(job: Job) -> Plan:
    p = _canonical_megatron(job, job.plan)
    # GPipe runs as 1F1B; interleaving with one stage per rank is 1F1B
    one_f_one_b = p.schedule == Schedule.GPIPE or (p.schedule == Schedule.INTERLEAVED_1F1B and p.vpp == 1)
    return replace(p, zero=1 if p.zero == 2 else p.zero,
                   schedule=Schedule.ONE_F_ONE_B if one_f_one_b else p.schedule)


def normalise_torchtitan(job: Job) -> Plan:
    p = _canonical(job, job.plan)
    return replace(p, zero=2 if p.zero == 1 else p.zero, sp=p.dims.tp > 1)


SETTINGS = settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@SETTINGS
@given(jobs())
def test_megatron_roundtrip(job):
    try:
        text = export_job(job, "megatron").text
    except MeshplanError:
        return
    back = import_megatron(text, num_gpus=job.cluster.num_gpus)
    assert back.model.num_params() == job.model.num_params()
    assert back.training.precision == job.training.precision
    assert _canonical_megatron(job, back.plan) == normalise_megatron(job)


def normalise_torchtitan_cli(job: Job) -> Plan:
    """torchtitan >= 0.3 also drops the rotate method: context parallel is its ring."""
    return replace(normalise_torchtitan(job), cp_method=CPMethod.RING)


@SETTINGS
@given(jobs())
def test_torchtitan_roundtrip(job):
    try:
        text = export_job(job, "torchtitan", "0.2.0").text
    except MeshplanError:
        return
    back = import_torchtitan(tomllib.loads(text), num_gpus=job.cluster.num_gpus,
                             num_layers=job.model.num_layers)
    assert _canonical(job, back.plan) == normalise_torchtitan(job)
    expected = Precision.BF16 if job.training.precision == Precision.FP16 else job.training.precision
    assert back.training.precision == expected
    assert back.training.global_batch == job.training.global_batch


@SETTINGS
@given(jobs())
def test_torchtitan_command_line_roundtrip(job):
    try:
        text = export_job(job, "torchtitan", "0.3.0").text
    except MeshplanError:
        return
    back = import_torchtitan(parse_command_line(text).cfg, num_gpus=job.cluster.num_gpus,
                             num_layers=job.model.num_layers)
    assert _canonical(job, back.plan) == normalise_torchtitan_cli(job)
    expected = Precision.BF16 if job.training.precision == Precision.FP16 else job.training.precision
    assert back.training.precision == expected
    assert back.training.global_batch == job.training.global_batch


@SETTINGS
@given(jobs())
def test_megatron_bridge_roundtrip(job):
    """The Bridge overrides carry the Megatron-LM export's choices: the same plan comes back."""
    try:
        text = export_job(job, "megatron-bridge").text
    except MeshplanError:
        return
    back = import_megatron_bridge(text, num_gpus=job.cluster.num_gpus, model=job.model)
    assert back.training.precision == job.training.precision
    assert back.training.global_batch == job.training.global_batch
    assert _canonical_megatron(job, back.plan) == normalise_megatron(job)


def test_megatron_roundtrip_keeps_model_shape():
    """The exported shape arguments rebuild the same architecture (same parameter count)."""
    for job in (cases.gpt3_narayanan(), cases.llama70b_hsdp(), cases.llama8b_zero2()):
        back = import_megatron(export_job(job, "megatron").text, num_gpus=job.cluster.num_gpus)
        assert back.model.num_params() == job.model.num_params()
        assert back.model.num_kv_heads == job.model.num_kv_heads


def test_narayanan_command_line_imports():
    """A Megatron command line in the style of examples/sc21 (old --checkpoint-activations flag,
    launcher prefix giving 192 x 8 GPUs) gives GPT-3 175B's published plan."""
    text = """torchrun --nnodes 192 --nproc_per_node 8 pretrain_gpt.py \\
      --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \\
      --num-layers-per-virtual-pipeline-stage 4 --num-layers 96 --hidden-size 12288 \\
      --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 \\
      --micro-batch-size 1 --global-batch-size 1536 --lr 6.0e-5 --vocab-file gpt2-vocab.json \\
      --checkpoint-activations --fp16"""
    back = import_megatron(text, vocab_default=50257)
    assert back.num_gpus == 1536 and back.gpus_per_node == 8
    assert back.plan == cases.gpt3_narayanan().plan
    assert back.model.num_params() == model_preset("gpt3-175b").num_params()
    assert "--lr" in back.ignored and "--vocab-file" in back.ignored


@pytest.mark.parametrize("args,msg", [
    ("--tensor-model-parallel-size 8 --global-batch-size 8 --seq-length 2048", "not divisible by tp"),
    ("--seq-length 2048", "no --global-batch-size"),
    ("--num-layers 4 --global-batch-size 8 --seq-length 128", "part of the model shape"),
    ("--global-batch-size 8 --seq-length 128 --recompute-granularity everything", "invalid choice"),
    ("--global-batch-size 8 --seq-length 128 --micro-batch-size 0", "must be positive"),
])
def test_megatron_import_bad_input(args, msg):
    with pytest.raises(MeshplanError, match=msg):
        import_megatron(args, num_gpus=12)


def test_megatron_uneven_split_uses_first_last_flags():
    job = cases.gpt3_narayanan()
    plan = Plan(dims=ParallelDims(dp_replicate=24, tp=8, pp=8), micro_batch=1, recompute=Recompute.FULL,
                recompute_layers=(2,) * 8, stage_layers=(10, 13, 13, 13, 13, 13, 13, 8))
    text = export_job(replace(job, plan=plan), "megatron").text
    assert "--decoder-first-pipeline-num-layers 10" in text
    assert "--decoder-last-pipeline-num-layers 8" in text
    assert "--recompute-method block" in text and "--recompute-num-layers 2" in text
    assert import_megatron(text, num_gpus=1536).plan == plan


def test_megatron_ragged_split_uses_layout():
    """A split Megatron's first/last counts cannot express (here with virtual stages) goes
    through --pipeline-model-parallel-layout, with a warning, and imports back unchanged."""
    job = cases.gpt3_narayanan()
    layers = (3, 4, 4, 4, 4, 4, 4, 4) + (4,) * 15 + (5,)
    plan = replace(job.plan, stage_layers=layers)
    exp = export_job(replace(job, plan=plan), "megatron")
    assert "--pipeline-model-parallel-layout Et*3|t*4|" in exp.text and exp.text.count("|") == 23
    assert "t*5L" in exp.text and "--num-layers-per-virtual-pipeline-stage" not in exp.text
    assert any("experimental" in w for w in exp.warnings)
    back = import_megatron(exp.text, num_gpus=1536)
    assert back.plan.vpp == 3 and back.plan.stage_layers == layers
    assert back.plan == plan


@pytest.mark.parametrize("layout,msg", [
    ("Et*2|t*2m|tL", "transformer layers after the MTP modules"),
    ("t*2|Et*2|tL", "the embedding E must open the first stage"),
    ("Et*2||t*2L", "every stage needs at least one layer"),
    ("Et*2|t*2|tq", "'q' is not a stage separator"),
])
def test_megatron_bad_layouts(layout, msg):
    with pytest.raises(MeshplanError, match=msg):
        import_megatron(f"--pipeline-model-parallel-size 3 --global-batch-size 8 --seq-length 128 "
                        f"--pipeline-model-parallel-layout '{layout}'", num_gpus=3)
