"""Physical bounds and weak priors of the fitted fields (calib/priors.py), the forked fits
(calib/forked.py) and the held-out folds' warm start (calib/holdout.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.calib.fit import PER_TOKEN_GRID, SPECIFIC_GRID, TIME_GRID, fit_all, run_start
from meshplan.calib.fit_search import Objective, descend
from meshplan.calib.forked import map_forked
from meshplan.calib.holdout import HOW, _fold, leave_one_out
from meshplan.calib.priors import FIELD_PRIORS, FieldPrior, bounded_grid
from meshplan.calib.validate import build_run, predicted_metric
from meshplan.cost.calibration import Calibration
from meshplan.cost.step import estimate
from meshplan.errors import MeshplanError

ROW = dict(id="1", source="Synth2024 Table 1", model="GPT", num_layers="8", hidden_size="2048",
           num_heads="16", vocab_size="51200", seq_len="2048", gpu="a100-80gb", num_gpus="16",
           gpus_per_node="8", global_batch_size="64", micro_batch_size="2", tp="2", pp="2",
           recompute="full", precision="fp16", flops_basis="hardware", measured_tflops_per_gpu="1",
           measured_peak_mem_gib="1", notes="")


def test_every_fitted_time_field_has_a_range_with_a_source_that_holds_its_start():
    grids = {**TIME_GRID, **SPECIFIC_GRID, **PER_TOKEN_GRID}
    for name, grid in grids.items():
        prior = FIELD_PRIORS[name]
        assert prior.source and prior.low < prior.high
        start = getattr(Calibration(), name)
        assert prior.low <= start <= prior.high, name  # the literature default is physical
        assert len(bounded_grid(name, grid)) >= 2, name
    # the per-token memory factor cannot go below one fused pass per op nor past three
    assert bounded_grid("elementwise_time_factor", (0.5, 1.0, 3.0, 4.0)) == (1.0, 3.0)
    # the session-8 edges are outside: NVLink at 0.4 of its rate, a NIC at its whole line rate
    assert 0.4 not in bounded_grid("intra_node_comm_efficiency", (0.4, 0.5, 0.6, 0.8))
    assert bounded_grid("inter_node_comm_efficiency", (0.6, 0.9, 1.0)) == (0.6, 0.9)


def test_distance_by_hand():
    log = FieldPrior(low=0.5, high=2.0, log_scale=True, source="x")
    assert log.distance(1.0, 0.5) == pytest.approx(0.5)  # ln 2 / ln 4
    assert log.distance(0.5, 1.0) == log.distance(2.0, 1.0)  # halving and doubling: the same evidence
    lin = FieldPrior(low=0.0, high=4e-3, log_scale=False, source="x")
    assert lin.distance(1e-3, 0.0) == pytest.approx(0.25)
    with pytest.raises(MeshplanError, match="range"):
        FieldPrior(low=0.0, high=1.0, log_scale=True, source="x")
    with pytest.raises(MeshplanError, match="outside its range"):
        bounded_grid("intra_node_comm_efficiency", (0.1, 0.2))


def _objective(target_m: float) -> Objective:
    """One row sees only the GEMM efficiency; the comm efficiencies are seen by no row."""
    meas = np.array([1 / target_m])
    return Objective(rows=((0,),), predict=lambda g, c: np.array([1 / c.matmul_efficiency]),
                     score=lambda p: float(np.mean(np.abs(np.log(p / meas)))), size=1)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from((0.5, 0.6, 0.8, 0.9)), st.integers(0, 6))
def test_descent_moves_what_the_rows_pay_for_and_holds_the_rest_at_the_start(target, restarts):
    grid = {n: bounded_grid(n, TIME_GRID[n]) for n in ("matmul_efficiency", "intra_node_comm_efficiency",
                                                       "inter_node_comm_efficiency")}
    start = Calibration()
    fit = descend(_objective(target), start, grid, rounds=4, prior_weight=0.002, restarts=restarts)
    assert fit.matmul_efficiency == pytest.approx(target)
    # restarts move the comm fields at random; a flat loss and the prior bring them back
    assert fit.intra_node_comm_efficiency == start.intra_node_comm_efficiency
    assert fit.inter_node_comm_efficiency == start.inter_node_comm_efficiency
    for n, g in grid.items():
        assert min(g) <= getattr(fit, n) <= max(g)


def test_prior_center_is_not_the_warm_start():
    """A held-out refit begins at the full fit's values but the prior pulls to the start."""
    grid = {"intra_node_comm_efficiency": bounded_grid("intra_node_comm_efficiency",
                                                       TIME_GRID["intra_node_comm_efficiency"])}
    warm = Calibration(intra_node_comm_efficiency=0.6)
    flat = Objective(rows=((0,),), predict=lambda g, c: np.array([1.0]), score=lambda p: 0.0, size=1)
    assert descend(flat, warm, grid, 2, prior_weight=0.002).intra_node_comm_efficiency == 0.6
    back = descend(flat, warm, grid, 2, prior_weight=0.002, prior_center=Calibration())
    assert back.intra_node_comm_efficiency == Calibration().intra_node_comm_efficiency


def test_map_forked_keeps_order_and_reports_a_failure():
    assert map_forked(lambda x: x * x, list(range(7)), workers=3) == [x * x for x in range(7)]
    assert map_forked(lambda x: x + 1, [1], workers=4) == [2]

    def boom(x):
        if x == 2:
            raise ValueError("bad row")
        return x
    with pytest.raises(MeshplanError, match="bad row"):
        map_forked(boom, [1, 2, 3], workers=2)
    with pytest.raises(MeshplanError, match="workers"):
        map_forked(boom, [1], workers=0)


def _synth(truth: dict, **changes):
    run = build_run({**ROW, **changes})
    calib = run_start(run).replace_fields(**truth)
    est = estimate(run.model, run.cluster, run.training, run.plan, calib)
    return replace(run, measured=predicted_metric(run, est.step_time_s))


GRID = {"matmul_efficiency": TIME_GRID["matmul_efficiency"]}


def test_forked_fit_all_equals_the_serial_one():
    runs = [_synth({"matmul_efficiency": 0.6}, tp=str(t), micro_batch_size=str(mb), num_gpus=str(t * 8))
            for t, mb in [(1, 2), (2, 2), (4, 1)]]
    runs += [_synth({"matmul_efficiency": 0.8}, gpu="v100-32gb", tp=str(t), num_gpus=str(t * 8)) for t in (1, 2)]
    one = fit_all(runs, {}, rounds=2, memory_grid={}, restarts=0)
    two = fit_all(runs, {}, rounds=2, memory_grid={}, restarts=0, workers=2)
    assert set(one) == set(two) == {"ampere/megatron", "volta/megatron"}
    for k in one:
        assert one[k].values == two[k].values
        assert dict(one[k].settings) == dict(two[k].settings)
    assert two["ampere/megatron"].values["matmul_efficiency"] == pytest.approx(0.6)


def test_folds_refit_from_the_warm_start_and_pool_a_generation_with_no_rows_left():
    """Family C shares the ampere record with A: held out, ampere is refit on A's rows from the
    (deliberately wrong) full fit's values and finds the truth again; family B is all of volta:
    its rows are scored by a fit pooled over the stack's ampere rows."""
    a = [_synth({"matmul_efficiency": 0.6}, model="A", tp=str(t), num_gpus=str(t * 8)) for t in (1, 2, 4)]
    c = [_synth({"matmul_efficiency": 0.6}, model="C", tp="8", micro_batch_size=str(mb), num_gpus="64")
         for mb in (1, 2)]
    b = [_synth({"matmul_efficiency": 0.8}, model="B", gpu="v100-32gb", tp=str(t), num_gpus=str(t * 8))
         for t in (1, 2)]
    rows = a + b + c
    full = {"ampere/megatron": {"matmul_efficiency": 0.5}, "volta/megatron": {"matmul_efficiency": 0.8}}
    g, errs = _fold(rows, lambda r: r.family, "c", {}, 2, 0, full)
    assert g == "c" and len(errs) == 2 and all(abs(e) < 0.02 for e in errs)
    g, errs = _fold(rows, lambda r: r.family, "b", {}, 2, 0, full)
    # predicted at ampere's 0.6 where volta ran at 0.8: slower, by up to 0.6 / 0.8 - 1 (the GEMM
    # share of the step)
    assert len(errs) == 2 and all(0.6 / 0.8 - 1 - 1e-9 < e < -0.1 for e in errs)
    held = leave_one_out(rows, "family", {}, rounds=2, full=full, workers=2)
    assert set(held.groups) == {"a", "b", "c"} and held.how == HOW and len(held.errors) == 7
    assert held.summary()["median_of_group_medians"] == pytest.approx(
        np.median([v["median_abs_error"] for v in held.groups.values()]))
    assert math.isfinite(held.summary()["p90_abs_error"])
