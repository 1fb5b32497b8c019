"""Memory on the basis it was measured (issue 14, item 5: "peak allocated and peak reserved"):
the device total beside them, the optimizer step's gradient copies, and validate comparing each
row with the matching prediction. Golden numbers worked by hand."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st

from meshplan.calib.validate import build_run, evaluate, load_runs, memory_on_basis
from meshplan.cost import PlanArrays, estimate
from meshplan.cost.calibration import Calibration
from meshplan.cost.device_memory import (MemoryBasis, memory_basis, nccl_buffer_bytes, nccl_communicators,
                                         outside_allocator_bytes, predicted_bytes)
from meshplan.cost.step_memory import step_excess_bytes, step_extra_bytes
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan, Recompute
from meshplan.spec.cluster import GIB, system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MIB = 1024**2
H100 = system_preset("dgx-h100", 8)  # 64 GPUs
MODEL = model_preset("llama3-8b")
TRAIN = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16")
# tp 8 x pp 4 x dp_shard 2: three NCCL communicators (tp, dp, pp); cp, ep, dp_replicate are 1
PLAN = Plan(dims=ParallelDims(dp_shard=2, tp=8, pp=4), zero=1, micro_batch=1, recompute=Recompute.FULL)


def test_nccl_buffers_by_hand():
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    assert nccl_communicators(arrays)[0] == 3
    # 3 communicators x 16 channels x 2 peers x NCCL_BUFFSIZE 4 MiB = 384 MiB
    assert nccl_buffer_bytes(arrays, Calibration())[0] == 384 * MIB
    # the CUDA context (lazy loading: 287,047,680 bytes ~ 0.27 GiB) on top
    assert outside_allocator_bytes(arrays, Calibration())[0] == pytest.approx(0.27 * GIB + 384 * MIB)
    one_gpu = PlanArrays.from_plans([Plan(dims=ParallelDims()).with_defaults(MODEL)])
    assert nccl_communicators(one_gpu)[0] == 0  # a single GPU: no communicator, the context only


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=6, max_size=6))
def test_one_communicator_per_axis_of_more_than_one_rank(degrees):
    tp, cp, dp_shard, dp_replicate, ep, pp = degrees
    assume((dp_shard * cp) % ep == 0)  # expert parallel reuses the sharded-data and context ranks
    plan = Plan(dims=ParallelDims(tp=tp, cp=cp, dp_shard=dp_shard, dp_replicate=dp_replicate, ep=ep, pp=pp),
                zero=1 if dp_shard > 1 else 0)
    arrays = PlanArrays.from_plans([plan])
    assert nccl_communicators(arrays)[0] == sum(d > 1 for d in degrees)


def test_estimate_reports_the_device_total_beside_reserved_and_allocated():
    est = estimate(MODEL, H100, TRAIN, PLAN, Calibration())
    outside_gib = 0.27 + 384 / 1024
    assert est.peak_device_gib == pytest.approx(est.peak_memory_gib + outside_gib)
    assert est.peak_allocated_gib < est.peak_memory_gib < est.peak_device_gib
    assert est.to_dict()["peak_device_gib"] == est.peak_device_gib
    # a stack of libraries built before CUDA 11.7 loads every kernel image: 666,632,192 bytes
    eager = estimate(MODEL, H100, TRAIN, PLAN, Calibration().replace_fields(cuda_context_gib=0.62))
    assert eager.peak_device_gib - eager.peak_memory_gib == pytest.approx(0.62 + 384 / 1024)
    assert eager.peak_memory_gib == pytest.approx(est.peak_memory_gib)  # outside the allocator


def test_predicted_bytes_picks_the_measured_figure():
    arrays = PlanArrays.from_plans([PLAN.with_defaults(MODEL)])
    calib = Calibration()
    kw = dict(allocated_bytes=10.0 * GIB, reserved_bytes=11.0 * GIB, plans=arrays, calib=calib)
    assert predicted_bytes(MemoryBasis.ALLOCATED, **kw) == 10.0 * GIB
    assert predicted_bytes(MemoryBasis.RESERVED, **kw) == 11.0 * GIB
    assert predicted_bytes(MemoryBasis.DEVICE, **kw)[0] == pytest.approx(11.0 * GIB + 0.27 * GIB + 384 * MIB)


def test_memory_basis_names():
    assert memory_basis(" Device ") == MemoryBasis.DEVICE
    assert memory_basis("") == MemoryBasis.RESERVED  # what meshplan's peak memory is
    with pytest.raises(MeshplanError, match="'nvidia-smi' is not one of allocated, reserved, device"):
        memory_basis("nvidia-smi")


# ---- the optimizer step's gradient copies (cost/step_memory.py) ----------------------------
DS = Calibration().replace_fields(fp16_step_grad_copy_bytes_per_param=8.0,
                                  fp16_zero_step_grad_copy_bytes_per_param=6.0)
FP16 = TrainingSpec(seq_len=2048, global_batch=64, precision="fp16")


def test_step_copies_by_hand():
    P = 1e9  # parameters on the rank
    # no ZeRO: fp32 copy of every gradient + the flat fp32 buffer = 8 bytes each, fp16 grads kept
    assert step_extra_bytes(DS, 0, rank_params=P, partition_params=P, grads_bytes=2 * P,
                            grad_bytes_per_param=2.0) == 8e9
    # ZeRO-1 over 4 ranks: the partition (P/4) keeps its fp16 grads (2) and its copies (2 + 4),
    # the other 3/4 of the grads are freed: 8 x 0.25e9 - 2e9 = 0
    assert step_extra_bytes(DS, 1, rank_params=P, partition_params=P / 4, grads_bytes=2 * P,
                            grad_bytes_per_param=2.0) == 0.0
    # ZeRO-1 over 1 rank: 6 bytes per parameter
    assert step_extra_bytes(DS, 1, rank_params=P, partition_params=P, grads_bytes=2 * P,
                            grad_bytes_per_param=2.0) == 6e9
    # the step runs with no activation alive: the peak adds only what tops the backward's
    kw = dict(rank_params=P, partition_params=P, grads_bytes=2 * P, grad_bytes_per_param=2.0)
    assert step_excess_bytes(FP16, DS, 0, activations_bytes=3e9, **kw) == 5e9
    assert step_excess_bytes(FP16, DS, 0, activations_bytes=9e9, **kw) == 0.0
    bf16 = TrainingSpec(seq_len=2048, global_batch=64, precision="bf16")
    assert step_excess_bytes(bf16, DS, 0, activations_bytes=0.0, **kw) == 0.0  # fp32 grads: no copy
    assert step_excess_bytes(FP16, Calibration(), 0, activations_bytes=0.0, **kw) == 0.0  # not this stack


def test_step_copies_in_the_estimate():
    """GPT-2 sized model on one GPU, fp16, no ZeRO: the step's 8 bytes per parameter beyond the
    activations land in `other`, with the allocator's reserve on them."""
    model = model_preset("gpt2-xl")
    cluster = system_preset("dgx-a100", 1).with_gpus(1)
    plan = Plan(dims=ParallelDims(), micro_batch=1, recompute=Recompute.FULL)
    fp16 = TrainingSpec(seq_len=1024, global_batch=8, precision="fp16")  # GPT-2's 1024 positions
    base = estimate(model, cluster, fp16, plan, Calibration())
    ds = estimate(model, cluster, fp16, plan, DS)
    m = ds.memory
    params = m.parameters_bytes / 2.0  # fp16 weights
    excess = 8.0 * params - m.activations_bytes
    assert excess > 0
    assert m.step_excess_bytes == pytest.approx(excess)
    frag = Calibration().allocator_fragmentation
    assert (ds.peak_memory_gib - base.peak_memory_gib) * GIB == pytest.approx(excess * (1 + frag))


# ---- validate compares each row with the prediction of what it measured ------------------
ROW = dict(id="b1", source="BLOOM tr11 notes", model="", num_layers="24", hidden_size="2048", num_heads="16",
           vocab_size="50257", seq_len="2048", gpu="a100-80gb", num_gpus="16", gpus_per_node="8",
           global_batch_size="512", micro_batch_size="2", tp="2", pp="2", dp="4", zero="1", recompute="full",
           precision="fp16", measured_tflops_per_gpu="120", flops_basis="hardware",
           measured_peak_mem_gib="20", framework="megatron-deepspeed")


@pytest.mark.parametrize("basis, figure", [("device", "peak_device_gib"), ("reserved", "peak_memory_gib"),
                                           ("allocated", "peak_allocated_gib"), ("", "peak_memory_gib")])
def test_validate_compares_with_the_matching_prediction(basis, figure):
    run = build_run({**ROW, "memory_basis": basis})
    row = evaluate([run], []).rows[0]
    from meshplan.calib.validate import setting_calibration
    est = estimate(run.model, run.cluster, run.training, run.plan, setting_calibration(run, None, dict(run.settings)))
    assert row.predicted_memory_gib == pytest.approx(getattr(est, figure))
    assert row.memory_error == pytest.approx(getattr(est, figure) / 20.0 - 1.0)
    assert row.memory_basis == (basis or "reserved")
    assert ("memory_basis: reserved (blank)" in run.assumed) == (basis == "")
    assert memory_on_basis(est, run.memory_basis) == pytest.approx(getattr(est, figure))


def test_device_prediction_adds_the_stacks_context_and_nccl():
    """The megatron-deepspeed row: tp, pp, dp communicators, an eager CUDA context (0.62 GiB)."""
    run = build_run({**ROW, "memory_basis": "device"})
    row = evaluate([run], []).rows[0]
    reserved = build_run({**ROW, "memory_basis": "reserved"})
    gap = row.predicted_memory_gib - evaluate([reserved], []).rows[0].predicted_memory_gib
    assert gap == pytest.approx(0.62 + 3 * 16 * 2 * 4 / 1024)


def test_optimistic_rows_are_counted(tmp_path):
    low = {**ROW, "memory_basis": "device", "measured_peak_mem_gib": "1000"}  # predicted far below
    high = {**ROW, "id": "b2", "memory_basis": "device", "measured_peak_mem_gib": "1"}
    report = evaluate([build_run(low), build_run(high)], [])
    assert report.memory_optimistic_rows == 1
    assert report.summary()["memory_rows_by_basis"] == {"device": 2}


def test_a_memory_basis_no_one_knows_refuses_the_file(tmp_path):
    import csv

    from meshplan.calib.validate import REQUIRED_COLUMNS
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*dict.fromkeys([*REQUIRED_COLUMNS, *ROW]), "memory_basis"], restval="")
        w.writeheader()
        w.writerow({**ROW, "memory_basis": "smi"})
    with pytest.raises(MeshplanError, match="column memory_basis: memory basis 'smi' is not one of"):
        load_runs(path)


def test_frameworks_that_differ_in_memory_settings_alone_fit_together():
    """Megatron-LM's and Megatron-DeepSpeed's rows share kernels and overlap (one fit), not the
    memory DeepSpeed holds: each row keeps its own memory settings (calib/fit.py)."""
    from types import SimpleNamespace

    from meshplan.calib.fit import MEMORY_SETTINGS, shared_settings
    from meshplan.spec.frameworks import framework_defaults

    lm, ds = (SimpleNamespace(settings=framework_defaults(n).settings) for n in ("megatron-lm", "megatron-deepspeed"))
    shared = shared_settings([lm, ds], {})
    assert not set(shared) & set(MEMORY_SETTINGS)
    assert shared == framework_defaults("megatron-lm").settings
