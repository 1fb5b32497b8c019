"""The schedule simulator (hand-computed makespans), the timeline's agreement with the cost
model, and the PNG charts (decoded back to check they are real, non-blank images)."""

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

import export_cases as cases
from meshplan.cost import estimate
from meshplan.errors import MeshplanError
from meshplan.plan import Schedule
from meshplan.report.memory_chart import memory_png, memory_rows_gib
from meshplan.report.schedule_sim import OpKind, StageTimes, rank_order, simulate
from meshplan.report.timeline import step_timeline, timeline_png


@pytest.mark.parametrize("schedule,vpp,expected", [
    # p=4, m=8, per rank F=1, B=2: (m + p - 1) * (F + B) = 11 * 3 = 33 for GPipe and 1F1B
    (Schedule.GPIPE, 1, 33.0),
    (Schedule.ONE_F_ONE_B, 1, 33.0),
    # interleaved, v=2 chunks of F=0.5, B=1: m * 3 + (p - 1) / v * 3 = 24 + 4.5 (Narayanan Sec. 2.2.2)
    (Schedule.INTERLEAVED_1F1B, 2, 28.5),
])
def test_makespan_by_hand(schedule, vpp, expected):
    tl = simulate([StageTimes(1 / vpp, 2 / vpp)] * (4 * vpp), 4, vpp, 8, schedule)
    assert tl.makespan_s == pytest.approx(expected)
    assert tl.bubble_s(0) == pytest.approx(expected - 24)


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16)])
def test_zero_bubble_matches_zb_h1(pp, m):
    """F = B = W = 1: ZB-H1's bubble is (p-1)(F+B-W) = p-1 (Qi et al. 2024, Sec. 3.1), against
    1F1B's (p-1)(F+B+W) = 3(p-1)."""
    tl = simulate([StageTimes(1, 2)] * pp, pp, 1, m, Schedule.ZERO_BUBBLE)
    assert tl.makespan_s == pytest.approx(3 * m + (pp - 1))
    assert sum(o.kind == OpKind.WEIGHT_GRAD for o in tl.ops) == pp * m


def test_1f1b_keeps_at_most_p_minus_r_in_flight():
    """PipeDream-flush: rank r never holds more than p - r forwards without their backward."""
    for r in range(4):
        held = peak = 0
        for kind, _, _ in rank_order(r, 4, 1, 8, Schedule.ONE_F_ONE_B):
            held += 1 if kind == OpKind.FORWARD else -1
            peak = max(peak, held)
        assert peak == 4 - r
    gpipe = rank_order(0, 4, 1, 8, Schedule.GPIPE)
    assert [k for k, _, _ in gpipe[:8]] == [OpKind.FORWARD] * 8


@given(pp=st.integers(1, 5), vpp=st.integers(1, 3), groups=st.integers(1, 3),
       schedule=st.sampled_from(list(Schedule)), f=st.floats(0.1, 2.0), b=st.floats(0.1, 4.0))
def test_dependencies_and_no_overlap(pp, vpp, groups, schedule, f, b):
    if vpp > 1 and (pp == 1 or not schedule.supports_virtual_stages):
        vpp = 1
    m = pp * groups
    tl = simulate([StageTimes(f, b)] * (pp * vpp), pp, vpp, m, schedule)
    end = {(o.kind, o.stage, o.microbatch): o.end_s for o in tl.ops}
    for o in tl.ops:
        if o.kind == OpKind.FORWARD and o.stage > 0:
            assert o.start_s >= end[(OpKind.FORWARD, o.stage - 1, o.microbatch)] - 1e-9
        if o.kind == OpKind.WEIGHT_GRAD:
            assert o.start_s >= end[(OpKind.BACKWARD, o.stage, o.microbatch)] - 1e-9
        if o.kind == OpKind.BACKWARD:
            assert o.start_s >= end[(OpKind.FORWARD, o.stage, o.microbatch)] - 1e-9
            if o.stage < pp * vpp - 1:
                assert o.start_s >= end[(OpKind.BACKWARD, o.stage + 1, o.microbatch)] - 1e-9
    for r in range(pp):
        mine = sorted((o for o in tl.ops if o.rank == r), key=lambda o: o.start_s)
        assert all(a.end_s <= c.start_s + 1e-9 for a, c in zip(mine, mine[1:]))
        assert tl.bubble_s(r) >= -1e-9
    # never better than perfect packing, never worse than running stages one after another
    work = m * (f + b) * vpp
    assert work - 1e-9 <= tl.makespan_s <= m * (f + b) * pp * vpp + 1e-9


def test_interleaved_needs_divisible_microbatches():
    with pytest.raises(MeshplanError, match="divisible by pp"):
        simulate([StageTimes(1, 2)] * 8, 4, 2, 6, Schedule.INTERLEAVED_1F1B)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _not_blank(data: bytes) -> bool:
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(data), format="png")
    return float(img[..., :3].std()) > 0.05


def test_timeline_agrees_with_cost_model_and_renders():
    job = cases.gpt3_narayanan()
    est = estimate(job.model, job.cluster, job.training, job.plan)
    step = step_timeline(est)
    # the simulated step uses the cost model's per-rank times; it should land within 3% of the
    # cost model's closed form m*t + (p-1)/v*t + tail
    assert step.step_s == pytest.approx(est.step_time_s, rel=0.03)
    png = timeline_png(step, "GPT-3 175B")
    w, h = _png_size(png)
    assert w > 600 and h > 300 and _not_blank(png)


def test_memory_chart_matches_estimate():
    job = cases.llama70b_hsdp()
    est = estimate(job.model, job.cluster, job.training, job.plan)
    rows = memory_rows_gib(est)
    assert len(rows) == job.plan.dims.pp
    assert max(sum(r.values()) for r in rows) == pytest.approx(est.peak_memory_gib, rel=1e-6)
    png = memory_png(est)
    w, h = _png_size(png)
    assert w > 400 and h > 300 and _not_blank(png)


def test_long_step_elides_the_steady_state():
    """128 micro-batches on pp=4: the chart keeps warm-up and cool-down and cuts the middle; the
    cut lies inside the schedule and leaves the bubble on both sides of it; 8 micro-batches: no cut."""
    from dataclasses import replace

    from meshplan.report.timeline import ELIDE_ABOVE_MICROBATCHES, elided_window

    job = cases.gpt3_narayanan()
    long = replace(job.training, global_batch=job.training.global_batch * 4)
    est = estimate(job.model, job.cluster, long, job.plan)
    assert est.time.num_microbatches > ELIDE_ABOVE_MICROBATCHES
    step = step_timeline(est)
    cut = elided_window(step)
    assert cut is not None and 0 < cut[0] < cut[1] < step.timeline.makespan_s
    assert cut[1] - cut[0] > 0.5 * step.timeline.makespan_s  # most of the step is steady state
    png = timeline_png(step, "GPT-3 175B, long step")
    w, h = _png_size(png)
    assert w > 600 and _not_blank(png)
    short = simulate([StageTimes(1, 2)] * 4, 4, 1, 8, Schedule.ONE_F_ONE_B)
    assert elided_window(type(step)(timeline=short, tail_s=0.0)) is None


@pytest.mark.parametrize("pp", [1, 2, 8])
def test_timeline_legend_never_covers_the_axis_labels(pp):
    """The legend, the axis label and the tick labels lie in separate bands at any number of
    ranks (a one-rank chart once drew its legend over "seconds into the step")."""
    import matplotlib.pyplot as plt

    from meshplan.report.timeline import StepTimeline, timeline_figure

    tl = simulate([StageTimes(1, 2)] * pp, pp, 1, 64, Schedule.ONE_F_ONE_B)
    fig = timeline_figure(StepTimeline(timeline=tl, tail_s=1.0))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            label = ax.xaxis.label.get_window_extent(renderer)
            assert legend.y1 <= label.y0, (pp, legend, label)
            assert label.y1 <= ax.get_window_extent(renderer).y0
        title = fig.texts[0].get_window_extent(renderer)
        assert title.y0 >= max(a.get_window_extent(renderer).y1 for a in fig.axes)
    finally:
        plt.close(fig)
