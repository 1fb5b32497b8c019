"""Prediction for a run and its comparison with measurements (meshplan.calib.predict, no torch)."""

from pathlib import Path

import pytest

from meshplan.cost import estimate
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.calib.hardware import runtime_storage
from meshplan.calib.predict import compare, comparison_table, predict
from meshplan.spec.cluster import GIB, system_preset
from meshplan.calib.hwcalib import calibration_from_profile_data, host_time_scaled
from meshplan.calib.hwprofile import apply_profile_data, load_profile
from meshplan.cost.calibration import calibration_for
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

GOLDEN = Path(__file__).parent / "data" / "hwprofile_small.json"


def _job(precision=Precision.FP32, dp=2):
    return Job(model=model_preset("toy-gpt"), training=TrainingSpec(seq_len=64, global_batch=8, precision=precision),
               cluster=system_preset("cpu").with_gpus(dp), plan=Plan(dims=ParallelDims(dp_replicate=dp), micro_batch=2))


def test_cpu_prediction_uses_profile_and_fp32_storage():
    job = _job()
    pred = predict(job, str(GOLDEN), "cpu")
    profile = load_profile(GOLDEN)
    cluster = apply_profile_data(job.cluster, profile)
    fitted = calibration_from_profile_data(profile, "golden", Precision.FP32, calibration_for(cluster.gpu))[0]
    calib = runtime_storage(host_time_scaled(fitted, profile, 2), Precision.FP32, "cpu")
    est = estimate(job.model, cluster, job.training, job.full_plan, calib)
    assert pred.step_time_s == pytest.approx(est.step_time_s)
    # fp32 weights and grads, no master copy: 4 + 4 bytes, then Adam's 8 (dp without ZeRO: no sharding)
    n = job.model.num_params()
    assert est.memory.parameters_bytes == pytest.approx(4 * n, rel=0.02)
    assert est.memory.gradients_bytes == pytest.approx(4 * n, rel=0.02)
    # the profile's worker RSS is in the framework overhead; the cost model itself sizes fp32
    # activations at 4 bytes per element, so the prediction is its total with no rescaling
    assert est.memory.other_bytes >= 3e8
    assert pred.peak_memory_gib * GIB == pytest.approx(est.memory.total_bytes)
    # one layer's kept input under full recompute, (b*S) x D fp32 elements: 2*64 * D * 4 bytes
    from meshplan.cost.arrays import PlanArrays
    from meshplan.cost.layer import layer_cost
    full = Plan(dims=ParallelDims(dp_replicate=2), micro_batch=2, recompute="full").with_defaults(job.model)
    lc = layer_cost(job.model, cluster, job.training, PlanArrays.from_plans([full]), calib)
    assert lc.act_full_bytes[0] == pytest.approx(2 * 64 * job.model.hidden_size * 4)
    assert "profile:hwprofile_small.json" in pred.calibration_source
    assert "ru_maxrss" in pred.memory_basis


def test_gpu_prediction_leaves_out_the_cuda_context():
    job = Job(model=model_preset("toy-gpt"), training=TrainingSpec(seq_len=64, global_batch=8),
              cluster=system_preset("dgx-h100").with_gpus(1), plan=Plan(micro_batch=2))
    pred = predict(job, None, "cuda")
    est = pred.estimate
    from meshplan.cost.calibration import calibration_for

    overhead = calibration_for(job.cluster.gpu).framework_overhead_gib * GIB
    assert pred.peak_memory_gib * GIB == pytest.approx(est.memory.total_bytes - overhead)


def test_compare_takes_the_median_after_warmup():
    pred = predict(_job(), str(GOLDEN), "cpu")
    cmp = compare(pred, [5.0, 3.0, 1.0, 1.2, 1.1], peak_memory_gib=0.5)
    assert cmp.measured_steps == 3 and cmp.measured_step_time_s == pytest.approx(1.1)
    assert cmp.step_time_error == pytest.approx((pred.step_time_s - 1.1) / 1.1)
    assert cmp.peak_memory_error == pytest.approx((pred.peak_memory_gib - 0.5) / 0.5)
    d = cmp.to_dict()
    assert d["measured_step_time_s"] == pytest.approx(1.1) and d["predicted_peak_memory_gib"] == pred.peak_memory_gib
    assert comparison_table(cmp).row_count == 2
    single = compare(pred, [2.0], peak_memory_gib=0.5)  # one step: nothing to leave out
    assert single.measured_step_time_s == 2.0
    with pytest.raises(ValueError):
        compare(pred, [], peak_memory_gib=0.5)


def test_attach_prediction_adds_fields_to_the_summary(tmp_path):
    import json

    from meshplan.calib.predict import attach_prediction

    log = tmp_path / "log.jsonl"
    rows = [{"step": i, "loss": 5.0, "step_time_s": t, "tokens_per_s": 1.0, "peak_memory_gib": m}
            for i, (t, m) in enumerate([(3.0, 0.4), (2.0, 0.5), (1.0, 0.6), (1.0, 0.6)], 1)]
    rows.append({"summary": True, "steps": 4, "peak_memory_gib": 0.6})
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a Job that says bf16 still runs in fp32 on CPU ranks: no error for the cpu preset's missing bf16
    cmp = attach_prediction(_job(precision=Precision.BF16), log, str(GOLDEN))
    assert cmp.measured_step_time_s == 1.0 and cmp.measured_peak_memory_gib == 0.6
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 5 and lines[:4] == rows[:4]
    summary = lines[-1]
    assert summary["steps"] == 4 and summary["measured_step_time_s"] == 1.0
    assert summary["predicted_step_time_s"] == pytest.approx(cmp.predicted_step_time_s)
    assert summary["step_time_error"] == pytest.approx(cmp.step_time_error)
