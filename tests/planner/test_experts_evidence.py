"""bench/experts_evidence.py: what the measurements say about a gain of bench_experts (issue 15
item 5), checked by hand on the shipped CSVs."""

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import experts_evidence as ev  # noqa: E402


@dataclass(frozen=True)
class FakeRow:
    """The fields of experts_compare.Row (bench_experts) the helpers read."""

    csv: str
    row_id: str
    ratio: float = 2.0
    term_deltas: dict = field(default_factory=dict)


def test_release_is_the_container_for_bridge_rows_and_the_paper_otherwise():
    assert ev.release("Megatron-Bridge 26.04.01") != ev.release("Megatron-Bridge 26.04")
    assert ev.release("Korthikanti2022 Table 5 (full recompute)") == ev.release("Korthikanti2022 Table 5 (present work)")


def test_unbuilt_sibling_is_the_same_jobs_ptd_p_row():
    """Narayanan et al. 2021 Table 2: GPT-3 175B on 1536 A100s, ZeRO-3 (row 14) 44 TFLOP/s per GPU,
    PTD-P (row 20, its layout not given, so the model cannot build it) 141: 141 / 44 = 3.2045."""
    sib = ev.measured_sibling(FakeRow("calibration", "14"))
    assert sib is not None and sib.row_id == "20" and sib.model is None and sib.same_release
    assert sib.measured == pytest.approx(141 / 44)
    assert "layout not given" in sib.cell()


def test_measured_sibling_prefers_the_same_release():
    """Korthikanti et al. 2022 Table 5, the 22B job on 8 A100s: full recompute (row 24) against
    selective + sequence parallel (row 25), the same publication: a measured gain."""
    sib = ev.measured_sibling(FakeRow("calibration", "24"))
    assert sib is not None and sib.row_id == "25" and sib.same_release and sib.measured > 1.2
    assert sib.model is not None and sib.model > 1  # the model orders them as measured


def test_contradicted_needs_opposite_order_beyond_the_threshold():
    assert ev.contradicted(ev.Sibling(measured=0.85, row_id="x", model=1.37, same_release=True))
    assert not ev.contradicted(ev.Sibling(measured=1.3, row_id="x", model=1.4, same_release=True))
    assert not ev.contradicted(ev.Sibling(measured=0.98, row_id="x", model=1.05, same_release=True))
    assert not ev.contradicted(ev.Sibling(measured=0.5, row_id="x", model=None, same_release=True))
    # across releases the same layout differs by up to 1.8x: a reversal there names no term
    assert not ev.contradicted(ev.Sibling(measured=0.85, row_id="x", model=1.37, same_release=False))


def test_measured_ratio_swaps_in_the_published_runs_measured_step():
    run = ev._runs_by_id("calibration")["24"]
    est, measured = ev._steps_of(run)
    assert measured == pytest.approx(1.42)  # Table 5: 1.42 s per iteration (step_time_s)
    assert ev.measured_ratio(FakeRow("calibration", "24", ratio=1.5)) == pytest.approx(1.5 * 1.42 / est)


def test_ordering_term_names_the_knob_and_the_term_that_reverse_the_order():
    """BLOOM row 206 (mb1) against its fastest measured sibling of the same release, row 207 (mb2,
    otherwise the same layout): measured 1.43x slower; what pushes the model towards mb1 is the
    pipeline bubble's share, halved by twice the micro-batches at the same global batch."""
    sib = ev.measured_sibling(FakeRow("calibration", "206"))
    assert sib.row_id == "207" and sib.same_release and sib.measured > 1.4
    text = ev.ordering_term(FakeRow("calibration", "206"), sib)
    assert "layouts differ in mb;" in text and "led by bubble -" in text


def test_run_calibration_matches_validate_with_the_release_presets():
    """Row 286 (DeepSeek-V3 on 256 GB300, Megatron-Bridge 26.08) runs the 26.08 presets' full-
    iteration CUDA graph (spec/presets/stack_releases.json): the experts page estimates it as
    ``meshplan validate`` does, so the published step is validate's, not one that pays the
    launches its graph removes."""
    from meshplan.calib.validate import evaluate
    from meshplan.cost import estimate

    run = ev._runs_by_id("megatron-bridge")["286"]
    calib = ev.run_calibration(run)
    assert calib.cuda_graph_full_iteration and run.release_values["cuda_graph_full_iteration"]
    step = estimate(run.model, run.cluster, run.training, run.plan, calib).step_time_s
    assert step == pytest.approx(evaluate([run], []).rows[0].predicted_step_s, rel=1e-12)


def test_micro_batch_pairs_put_the_larger_micro_batch_first_and_sign_its_over_credit():
    """Llama 3 70B fp8 on 64 GB200 (Megatron-Bridge, one release): row 542 runs mb2 with FSDP, row 543
    mb1 with pp4. Whatever order pairwise gives them, the pair names 542 as the larger micro-batch
    and its ratios are step(542) / step(543); a model ratio below the measured one is an over-credit."""
    found = {(p.larger, p.smaller): p for p in ev.micro_batch_pairs()}
    assert ("542", "543") in found and ("543", "542") not in found
    p = found[("542", "543")]
    assert p.generation == "blackwell"
    assert (p.over_credit > 0) == (p.model_ratio < p.measured_ratio)
    fake = ev.MicroBatchPair("a", "b", "blackwell", model_ratio=0.8, measured_ratio=0.9)
    assert fake.over_credit == pytest.approx(0.117783, abs=1e-6)  # ln(0.9 / 0.8)
