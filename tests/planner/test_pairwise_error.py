"""The error of the model's ratio between two measured layouts of one job (calib/pairwise.py),
checked by hand on made-up rows, and on the shipped data through validate."""

import math
from types import SimpleNamespace

import pytest

from meshplan.calib.pairwise import MEASURED_TIE, knobs_differing, measured_step_s, pairs, release, summarize
from meshplan.calib.validate import RowResult
from meshplan.plan import ParallelDims, Plan, Recompute, Schedule

BASE = Plan(dims=ParallelDims(dp_shard=8), zero=1)


def _run(row_id: str, plan: Plan, source: str = "Megatron-Bridge 26.02", gpus: int = 8):
    return SimpleNamespace(
        row_id=row_id, plan=plan, source=source, stack="megatron",
        model=SimpleNamespace(name="m", is_moe=False), cluster=SimpleNamespace(gpu=SimpleNamespace(name="h100"), num_gpus=gpus),
        training=SimpleNamespace(seq_len=4096, global_batch=64, precision=SimpleNamespace(value="bf16")))


def _row(row_id: str, metric: str, error: float, predicted_step_s: float) -> RowResult:
    return RowResult(row_id=row_id, source="", model="m", plan="", gpu="h100", metric=metric, measured=1.0,
                     predicted=None if error is None else 1.0 + error, error=error, measured_memory_gib=None, predicted_memory_gib=0.0,
                     memory_error=None, fits=True, oom=False, predicted_step_s=predicted_step_s)


def test_knobs_differing():
    mb4 = Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=4)
    tp2 = Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=1, sp=True)
    assert knobs_differing(BASE, mb4) == ("mb",)
    assert knobs_differing(BASE, tp2) == ("tp",)  # dp follows from the others at a fixed GPU count
    assert knobs_differing(tp2, Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=1)) == ("tp",)  # SP: a mode of TP
    pp2 = Plan(dims=ParallelDims(dp_shard=4, pp=2), zero=1, stage_layers=(3, 1))
    pp2v = Plan(dims=ParallelDims(dp_shard=4, pp=2), zero=1, schedule=Schedule.INTERLEAVED_1F1B, vpp=2,
                stage_layers=(1, 1, 1, 1))
    assert knobs_differing(pp2, pp2v) == ("schedule",)  # the split follows the schedule
    even = Plan(dims=ParallelDims(dp_shard=4, pp=2), zero=1, stage_layers=(2, 2))
    assert knobs_differing(pp2, even) == ("layers",)
    full = Plan(dims=ParallelDims(dp_shard=8), zero=1, recompute=Recompute.FULL)
    assert knobs_differing(BASE, full) == ("recompute",) and knobs_differing(BASE, BASE) == ()
    # an explicit even split, or one without a pipeline, is no knob
    assert knobs_differing(BASE, Plan(dims=ParallelDims(dp_shard=8), zero=1, stage_layers=(32,))) == ()
    assert knobs_differing(pp2v, Plan(dims=ParallelDims(dp_shard=4, pp=2), zero=1,
                                      schedule=Schedule.INTERLEAVED_1F1B, vpp=2)) == ()


def test_measured_step_by_metric():
    # step metric: predicted 2 s with error +25% -> measured 1.6 s; throughput metric: predicted
    # 2 s with throughput +25% over the measurement -> measured 2.5 s.
    assert measured_step_s(_row("a", "step_time_s", 0.25, 2.0)) == pytest.approx(1.6)
    assert measured_step_s(_row("a", "tflops_per_gpu", 0.25, 2.0)) == pytest.approx(2.5)
    assert measured_step_s(_row("a", None, None, 2.0)) is None


def test_pair_error_by_hand():
    """Model: a 1.0 s, b 1.2 s (a 1/1.2 of b). Measured: a's throughput is over-predicted by 30%
    (measured 1.3 s), b's under by 10% (1.08 s): measured ratio 1.3/1.08, model ratio 1/1.2; the
    model orders them the other way round, by more than the tie."""
    mb4 = Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=4)
    runs = [_run("a", BASE), _run("b", mb4), _run("c", mb4, source="Megatron-Bridge 26.04"), _run("d", BASE, gpus=16)]
    rows = [_row("a", "tokens_per_s_per_gpu", 0.30, 1.0), _row("b", "tokens_per_s_per_gpu", -0.10, 1.2),
            _row("c", "tokens_per_s_per_gpu", 0.0, 1.0), _row("d", "tokens_per_s_per_gpu", 0.0, 1.0)]
    found = pairs(runs, rows)
    assert len(found) == 1  # c ran another release, d another GPU count
    p = found[0]
    assert (p.a, p.b, p.knobs) == ("a", "b", ("mb",))
    assert p.error == pytest.approx(abs(math.log(1.0 / 1.2) - math.log(1.3 / 1.08)))
    assert p.misordered
    s = summarize(found)
    assert s["by_knob"]["mb"]["pairs"] == 1 and s["by_knob_alone"]["mb"]["misordered"] == 1
    assert s["by_knob"]["tp"]["pairs"] == 0 and s["by_knob"]["tp"]["median_abs_log_error"] is None


def test_a_measured_tie_is_not_misordered():
    mb4 = Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=4)
    half = MEASURED_TIE / 2  # measured 1.0 s and (1 + half) s: a tie, whichever way the model orders them
    found = pairs([_run("a", BASE), _run("b", mb4)],
                  [_row("a", "step_time_s", 0.0, 1.0), _row("b", "step_time_s", -half / (1 + half), 1.0)])
    assert found[0].measured_log_ratio == pytest.approx(-math.log1p(half)) and not found[0].misordered


def test_release():
    assert release("Megatron-Bridge 26.04.01 perf table") == "Megatron-Bridge 26.04.01 perf table"
    assert release("Narayanan2021 Table 1") == "Narayanan2021"
