"""Offload to host memory (issue 17): the cost terms by hand, the plan rules, the search's choice
and the exporters' mapping."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.cost.offload import OFFLOAD_FACTORS, host_budget_bytes
from meshplan.errors import MeshplanError
from meshplan.export.common import export_job
from meshplan.plan import Job, Offload, ParallelDims, Plan
from meshplan.search.planner import search
from meshplan.search.space import SearchOptions
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

L70 = model_preset("llama3-70b")
H100 = system_preset("dgx-h100")
TRAIN = TrainingSpec(seq_len=8192, global_batch=32)
O, P, A = Offload.OPTIMIZER, Offload.PARAMS, Offload.ACTIVATIONS


def _est(*offload, zero=3, model=L70, cluster=H100, training=TRAIN, **plan):
    p = Plan(dims=ParallelDims(dp_shard=cluster.num_gpus), zero=zero, recompute="full", offload=offload, **plan)
    return estimate(model, cluster, training, p)


def test_optimizer_offload_by_hand():
    """ZeRO-Offload: the optimizer shard moves to the host; the step pays CPU Adam over the GPU's
    parameter shard at half the host's DRAM bandwidth per GPU and the weights' upload over PCIe
    (the gradient download hides behind the backward)."""
    base, off = _est(), _est(O)
    calib = calibration_for(H100.gpu)
    shard_params = base.memory.parameters_bytes / calib.weight_bytes_per_param  # ZeRO-3: P / 8
    adam_s = shard_params * 30.0 / (614.4e9 / 8 * 0.5)
    upload_s = base.memory.parameters_bytes / 55e9
    assert off.time.offload_s == pytest.approx(adam_s + upload_s, rel=1e-9)
    assert off.time.optimizer_s == 0.0 and base.time.optimizer_s > 0
    assert off.memory.optimizer_bytes == 0.0
    assert off.host_memory_gib * GIB == pytest.approx(base.memory.optimizer_bytes, rel=1e-12)
    assert off.step_time_s == pytest.approx(base.step_time_s - base.time.optimizer_s + off.time.offload_s, rel=1e-9)


def test_params_offload_moves_shards_and_copies_them_every_microbatch():
    """ZeRO-Infinity: per micro-batch the parameter shard goes up twice and the gradient shard
    down once, hidden behind ~8 s of compute; the step keeps only CPU Adam (both already on host)."""
    base, off = _est(O), _est(O, P)
    calib = calibration_for(H100.gpu)
    assert off.memory.parameters_bytes == 0.0 and off.memory.gradients_bytes == 0.0
    m = base.time.num_microbatches
    per_mb = (2 * base.memory.parameters_bytes + base.memory.gradients_bytes) / 55e9
    adam_s = base.memory.parameters_bytes / calib.weight_bytes_per_param * 30.0 / (614.4e9 / 8 * 0.5)
    assert off.time.offload_s == pytest.approx(adam_s, rel=1e-9)
    assert off.time.offload_total_s == pytest.approx(m * per_mb + adam_s, rel=1e-9)
    assert off.host_memory_gib * GIB == pytest.approx(
        base.host_memory_gib * GIB + base.memory.parameters_bytes + base.memory.gradients_bytes, rel=1e-12)


def test_activation_offload_by_hand():
    """save_on_cpu copies on the compute stream: 2 x (one micro-batch's saved activations) / rate per
    micro-batch, all exposed, at the GPU's share of the node's host DRAM (614.4 GB/s x 0.5 / 8
    = 38.4 GB/s, below the 55 GB/s PCIe link: the node's 8 GPUs copy at once); the GPU keeps two
    layers' inputs (full recompute: b*S*D*2 bytes each)."""
    base, off = _est(zero=3), _est(A, zero=3)
    m = base.time.num_microbatches
    assert off.time.offload_s == pytest.approx(off.time.offload_total_s, rel=1e-12)  # nothing hidden
    saved_per_mb = off.time.offload_s * (614.4e9 * 0.5 / 8) / (2 * m)  # pp = 1: one micro-batch in flight
    kept = saved_per_mb - off.host_memory_gib * GIB
    assert kept == pytest.approx(2 * TRAIN.seq_len * L70.hidden_size * 2, rel=1e-9)
    assert off.step_time_s == pytest.approx(base.step_time_s + off.time.offload_s, rel=1e-9)


@pytest.mark.parametrize("offload", [(O,), (A,), (O, A), (O, P), (O, P, A)])
def test_each_choice_only_lowers_gpu_memory(offload):
    base, off = _est(), _est(*offload)
    assert off.peak_memory_gib < base.peak_memory_gib
    assert off.step_time_s > base.step_time_s - base.time.optimizer_s


def test_host_memory_overflow_does_not_fit():
    """Fits the GPUs, not the hosts. tp 2: at tp 1 one 405B layer's FSDP2 reduce-scatter input
    (3.2e9 parameters in fp32, meshplan/fsdp_policy.py) beside the gathered embedding and head
    takes the GPU past its 80 GiB; the host's share is the same at either tp."""
    l405 = model_preset("llama3.1-405b")
    c = system_preset("dgx-h100", num_nodes=4)
    e = estimate(l405, c, TRAIN, Plan(dims=ParallelDims(dp_shard=16, tp=2), sp=True, zero=3, recompute="full",
                                      offload=(O, P)))
    assert e.peak_memory_gib < e.gpu_memory_gib
    assert e.host_memory_gib > host_budget_bytes(c) / GIB
    assert not e.fits


def test_cluster_without_host_figures_refuses_offload():
    with pytest.raises(MeshplanError, match="offload cannot be estimated"):
        _est(O, cluster=system_preset("dgx-v100"))


def test_plan_rules_and_json():
    with pytest.raises(MeshplanError, match="needs 'optimizer'"):
        Plan(dims=ParallelDims(dp_shard=8), zero=3, offload=(P,))
    with pytest.raises(MeshplanError, match="needs zero 3"):
        Plan(dims=ParallelDims(dp_shard=8), zero=2, offload=(O, P))
    with pytest.raises(MeshplanError, match="offload="):
        Plan(offload=("disk",))
    p = Plan(dims=ParallelDims(dp_shard=8), zero=3, offload=(A, P, O))
    assert p.offload == (O, P, A)
    assert p.notation().endswith("offload=optimizer+params+activations")
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    old = p.to_dict()
    del old["offload"]  # a plan file written before offload existed
    assert Plan.from_dict(old).offload == ()


def test_search_finds_70b_on_8_gpus_only_with_offload():
    without = search(L70, H100, TRAIN, options=SearchOptions(offloads=()))
    assert without.recommended is None
    assert not any(pt.plan.offload for pt in without.frontier)
    with_ = search(L70, H100, TRAIN)
    rec = with_.recommended
    assert rec is not None and rec.plan.offload
    again = estimate(L70, H100, TRAIN, rec.plan)  # the search's figures are the estimate's
    assert again.step_time_s == pytest.approx(rec.step_time_s, rel=1e-9)
    assert again.fits and again.host_memory_gib * GIB <= host_budget_bytes(H100)


def test_search_keeps_offload_within_host_memory():
    l405 = model_preset("llama3.1-405b")
    c = system_preset("dgx-h100", num_nodes=4)
    res = search(l405, c, TrainingSpec(seq_len=8192, global_batch=64))
    for pt in res.frontier:
        if pt.plan.offload:
            e = estimate(l405, c, TrainingSpec(seq_len=8192, global_batch=64), pt.plan)
            assert e.host_memory_gib * GIB <= host_budget_bytes(c) * (1 + 1e-9)


def test_factors_are_named_with_sources():
    assert OFFLOAD_FACTORS.cpu_adam_bytes_per_param == 2 * 12 + 4 + 2


def _job(*offload, zero=2, **dims):
    dims = dims or dict(dp_shard=8)
    return Job(model=L70, training=TRAIN, cluster=H100,
               plan=Plan(dims=ParallelDims(**dims), zero=zero, recompute="full", offload=offload))


def test_exporters_map_or_refuse_offload():
    meg = export_job(_job(O), "megatron").text
    assert "--optimizer-cpu-offload" in meg and "--use-distributed-optimizer" in meg
    bridge = export_job(_job(O), "megatron-bridge").text
    assert "optimizer.optimizer_cpu_offload=true" in bridge
    with pytest.raises(MeshplanError, match="not the parameters"):
        export_job(_job(O, P, zero=3), "megatron")
    ds = json.loads(export_job(_job(O, P, zero=3), "deepspeed").text)["zero_optimization"]
    assert ds["offload_optimizer"]["device"] == "cpu" and ds["offload_param"]["device"] == "cpu"
    with pytest.raises(MeshplanError, match="activations"):
        export_job(_job(O, A), "deepspeed")
    tt = export_job(_job(O, P, zero=3), "torchtitan").text
    assert "--training.enable_cpu_offload" in tt
    with pytest.raises(MeshplanError, match="together"):
        export_job(_job(O), "torchtitan")
    assert replace(_job(O).plan, offload=()).offload == ()


def test_megatron_export_imports_back_with_offload():
    from meshplan.export.import_megatron import import_megatron

    job = _job(O)
    back = import_megatron(export_job(job, "megatron").text, num_gpus=8)
    assert back.plan.offload == (O,) and back.plan.zero in (1, 2)
    with pytest.raises(MeshplanError, match="fraction"):
        import_megatron(export_job(job, "megatron").text.replace("fraction 1.0", "fraction 0.5"), num_gpus=8)
