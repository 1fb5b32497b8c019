"""Activation recompute charged as Megatron runs it, checked against the one paper that measured
the same jobs both ways (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models"): Table 4 per layer of the 22B model, Table 5 end to end for 22B, 175B, 530B
and 1T (rows 24-31 of the shipped calibration CSV). Issue 15: most large "gains" of the search
over published plans drop full recompute; these tests pin how much of such a gain the model may
claim."""

from dataclasses import replace

import pytest

from meshplan.calib.validate import load_runs, predicted_metric, setting_calibration
from meshplan.cost import estimate
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.layer import layer_cost
from meshplan.data.published import runs_csv
from meshplan.plan import Recompute

FULL_LAYER_OVERHEAD = (27.2 - 19.6) / 19.6
"""Table 4, 22B layer (tp8, no sequence parallel): forward + backward 19.6 ms, 27.2 ms with full
recompute: the whole forward again, its TP all-reduces included (+39%)."""
SELECTIVE_LAYER_OVERHEAD = (20.3 - 19.0) / 19.0
"""Table 4: 19.0 ms with sequence parallel, 20.3 ms with selective recompute on top (+6.8%)."""
PAIRS = (("24", "25"), ("26", "27"), ("28", "29"), ("30", "31"))
"""Table 5: (full recompute, selective recompute + sequence parallel) of one job."""
SP_LAYER_RATIO = 19.0 / 19.6
"""Table 4: the 22B layer with sequence parallel (no recompute) against without: 3% faster, the
norms and dropouts on 1/t of the tokens less the backward's extra all-gather (Sec. 4.2.2)."""
SP_LAYER_TOLERANCE = 0.05
"""The model's ratio: 0.963 with the shipped fit, 0.925 with a refit whose NVLink is faster (the
cheaper the re-gather, the more the saving on the norms shows: the model charges their backward
2x their forward, the paper's backward saved 0.1 ms of the forward's 0.5); 0.911 without the
re-gather, which this tolerance refuses."""
MAX_OVERSTATEMENT = 0.09
"""The model claims at most this much more than the measured full/selective gain (1-7% with the
shipped fit, 1-8.3% with a refit, since the backward's TP collectives run as Megatron-LM 2022 ran
them, cost/tp_backward.py; 2-10% before: docs/experts.md)."""


@pytest.fixture(scope="module")
def runs():
    return {r.row_id: r for r in load_runs(runs_csv("calibration"))[0]}


def _layer(run):
    calib = setting_calibration(run, None, run.settings)
    return layer_cost(run.model, run.cluster, run.training, PlanArrays.from_plans([run.plan]), calib)


def _fwd_bwd_s(lc) -> float:
    return float(lc.fwd_compute_s[0] + lc.fwd_comm_exposed_s[0] + lc.bwd_compute_s[0] + lc.bwd_comm_exposed_s[0])


def test_full_recompute_costs_what_table_4_measured(runs):
    full = runs["24"]
    assert full.plan.recompute.value == "full" and not full.plan.sp and full.plan.dims.tp == 8
    lc = _layer(full)
    assert float(lc.recompute_full_s[0]) / _fwd_bwd_s(lc) == pytest.approx(FULL_LAYER_OVERHEAD, abs=0.05)


def test_selective_recompute_costs_what_table_4_measured(runs):
    sel = runs["25"]
    assert sel.plan.recompute.value == "selective" and sel.plan.sp
    lc = _layer(sel)
    assert float(lc.recompute_selective_s[0]) / _fwd_bwd_s(lc) == pytest.approx(SELECTIVE_LAYER_OVERHEAD, abs=0.03)


def test_sequence_parallel_saves_what_table_4_measured(runs):
    sel = runs["25"]  # the 22B job; its layer with and without sequence parallel, no recompute
    plain = replace(sel.plan, recompute=Recompute.NONE)
    no_sp = replace(plain, sp=False)
    with_sp = _fwd_bwd_s(_layer_of(sel, plain))
    without = _fwd_bwd_s(_layer_of(sel, no_sp))
    assert with_sp / without == pytest.approx(SP_LAYER_RATIO, abs=SP_LAYER_TOLERANCE)


def _layer_of(run, plan):
    calib = setting_calibration(run, None, run.settings)
    return layer_cost(run.model, run.cluster, run.training, PlanArrays.from_plans([plan]), calib)


def _step_s(run) -> tuple[float, float]:
    """(model step time, the step time the row's measured metric stands for)."""
    est = estimate(run.model, run.cluster, run.training, run.plan, setting_calibration(run, None, run.settings))
    if run.metric == "step_time_s":
        return est.step_time_s, run.measured
    return est.step_time_s, est.step_time_s * predicted_metric(run, est.step_time_s) / run.measured


@pytest.mark.parametrize("full_id,sel_id", PAIRS)
def test_gain_of_dropping_full_recompute_is_close_to_table_5(runs, full_id, sel_id):
    (ef, mf), (es, ms) = _step_s(runs[full_id]), _step_s(runs[sel_id])
    measured, model = mf / ms, ef / es
    assert 1.25 < measured < 1.35  # the paper: 29-32% faster
    assert measured * 0.97 <= model <= measured * (1 + MAX_OVERSTATEMENT)
