"""The recommendation robust to the model's error (issue 15 item 3): band overlap, memory
headroom from the memory error, unvalidated features, and the record it reads."""

import math
from dataclasses import dataclass, replace


from meshplan.plan import ParallelDims, Plan
from meshplan.search.robust import FEATURES, MIN_VALIDATED_ROWS, ModelError, model_error, robust_choice

GIB = 2**30


@dataclass(frozen=True)
class Point:
    plan: Plan
    step_time_s: float
    peak_memory_bytes: float

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return 1.0 / self.step_time_s


def _err(spread=0.05, mem=0.10, rows=None) -> ModelError:
    rows = rows if rows is not None else {name: 100 for name, _ in FEATURES}
    return ModelError(throughput_spread=spread, throughput_class="t", memory_abs_p90=mem, memory_class="m",
                      feature_rows=rows, source="test")


PLAIN = Plan(dims=ParallelDims(dp_shard=8), zero=1)
CP = Plan(dims=ParallelDims(dp_shard=4, cp=2), zero=1)
TP = Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=1, sp=True)


def test_headroom_beats_a_nominally_faster_plan_within_the_band():
    # budget 80 GiB, memory error 10%: 75 GiB needs 82.5 > 80, 60 GiB needs 66 <= 80
    front = [Point(CP, 1.00, 75 * GIB), Point(TP, 1.04, 60 * GIB), Point(PLAIN, 1.30, 40 * GIB)]
    c = robust_choice(front, 80 * GIB, 0, _err())
    assert c.index == 1 and c.nominal_index == 0
    assert "chosen over #0" in c.why and "headroom" in c.why


def test_outside_the_band_the_fastest_stays():
    # band 5%: 1.00 * 1.05 < 1.30 * 0.95, so only #0 is in the band, and it keeps no headroom
    front = [Point(CP, 1.00, 75 * GIB), Point(PLAIN, 1.30, 40 * GIB)]
    c = robust_choice(front, 80 * GIB, 0, _err())
    assert c.index == 0 and "no plan in the band keeps that headroom" in c.why


def test_headroom_grows_with_the_memory_error():
    """#1 uses ZeRO-3, which no run validates here, so with a small memory error #0 (73.5 GiB with
    5% headroom, within 80) wins; with a 20% memory error #0 would need 84 GiB and #1 wins."""
    rows = {name: 100 for name, _ in FEATURES} | {"ZeRO-3": 0}
    z3 = Plan(dims=ParallelDims(dp_shard=8), zero=3)
    front = [Point(CP, 1.00, 70 * GIB), Point(z3, 1.02, 50 * GIB)]
    low = robust_choice(front, 80 * GIB, 0, _err(mem=0.05, rows=rows))
    high = robust_choice(front, 80 * GIB, 0, _err(mem=0.20, rows=rows))
    assert low.index == 0 and high.index == 1 and high.required_headroom == 0.20
    assert high.unvalidated == ("ZeRO-3",)


def test_unvalidated_features_are_avoided():
    rows = {name: 100 for name, _ in FEATURES} | {"context parallel": MIN_VALIDATED_ROWS - 1}
    front = [Point(CP, 1.00, 50 * GIB), Point(TP, 1.03, 55 * GIB)]
    c = robust_choice(front, 80 * GIB, 0, _err(rows=rows))
    assert c.index == 1 and "avoids context parallel" in c.why and c.unvalidated == ()


def test_nothing_fits_is_none():
    assert robust_choice([Point(CP, 1.0, 90 * GIB)], 80 * GIB, None, _err()) is None


def test_record_falls_back_to_coarser_classes():
    """The shipped record (bench/model_error.py): a100 dense bf16 rows exist; a GPU no run used
    falls back to 'all'; every error is a fraction."""
    e = model_error(False, "bf16", "a100")
    assert e.throughput_class.endswith("a100") and 0 < e.throughput_spread < 1
    unknown = model_error(True, "fp4", "no-such-gpu")
    assert unknown.throughput_class == "all" and unknown.memory_class == "all"
    assert 0 < unknown.memory_abs_p90 < 1 and "validate" in unknown.source


def test_within_the_band_the_simpler_plan_wins_over_more_headroom():
    """Both keep the 10% headroom (60 and 40 GiB of 80); #1 uses context parallel and an uneven
    split (two features), #0 neither: #0 stays although #1 keeps 20 GiB more."""
    ragged = Plan(dims=ParallelDims(dp_shard=2, cp=2, pp=2), zero=1, stage_layers=(3, 1))
    front = [Point(PLAIN, 1.00, 60 * GIB), Point(ragged, 0.99, 40 * GIB)]
    c = robust_choice(front, 80 * GIB, 1, _err())
    assert c.index == 0 and c.nominal_index == 1
    assert "is simpler (no context parallel, uneven layer split)" in c.why


def test_headroom_breaks_ties_between_equally_simple_plans():
    cp_small = Plan(dims=ParallelDims(dp_shard=2, cp=4), zero=1)
    front = [Point(CP, 1.00, 60 * GIB), Point(cp_small, 1.01, 40 * GIB)]
    c = robust_choice(front, 80 * GIB, 0, _err())
    assert c.index == 1 and "20.0 GiB more memory headroom" in c.why


MB4 = Plan(dims=ParallelDims(dp_shard=8), zero=1, micro_batch=4)
EP2 = Plan(dims=ParallelDims(dp_shard=8, ep=2), zero=1)


def test_pairwise_error_narrows_the_band_between_plans_of_one_job():
    """PLAIN and MB4 differ only in the micro-batch. Absolute spread 10%: band (1.1 / 0.9) = 22%,
    so the 5%-slower PLAIN (more headroom) would be chosen; the measured pairs put the model's
    mb ratio within 2%, so PLAIN is outside its band and the nominal MB4 stays."""
    front = [Point(MB4, 1.00, 60 * GIB), Point(PLAIN, 1.05, 40 * GIB)]
    absolute = robust_choice(front, 80 * GIB, 0, _err(spread=0.10))
    pairwise = robust_choice(front, 80 * GIB, 0, replace(_err(spread=0.10), pairwise_errors={frozenset({"mb"}): (0.01, 0.02, 0.03)}))
    assert absolute.index == 1 and absolute.unmeasured_knobs == ("mb",)
    assert abs(absolute.band - (1.1 / 0.9 - 1)) < 1e-12
    assert pairwise.index == 0 and pairwise.band == 0.0


def test_pairwise_band_widens_where_the_data_measures_a_large_ratio_error():
    """The measured mb ratio error (8%) is wider than the absolute band (2%: 1.01 / 0.99): the
    6%-slower plan with more headroom is inside it, and the why names the knob and its error."""
    front = [Point(MB4, 1.00, 60 * GIB), Point(PLAIN, 1.06, 40 * GIB)]
    err = replace(_err(spread=0.01), pairwise_errors={frozenset({"mb"}): (0.01, math.log(1.08), 0.2)},
                  pairwise_source="pairs")
    c = robust_choice(front, 80 * GIB, 0, err)
    assert c.index == 1 and c.band_knobs == ("mb",) and abs(c.band - 0.08) < 1e-12
    assert "differ in mb (or some of them) is off by 8.0%, median of 3 pairs" in c.why
    assert "nominally 6.0% faster" in c.why


def test_a_knob_no_pair_measures_falls_back_to_the_absolute_band():
    err = replace(_err(spread=0.10), pairwise_errors={frozenset({"mb"}): (0.01, 0.01, 0.01)})
    band = err.band(EP2, MB4)
    assert band.unmeasured == ("ep",) and band.knobs == ("mb",)
    assert abs(band.log - math.log(1.1 / 0.9)) < 1e-12
    assert err.band(MB4, MB4).log == 0.0


def test_band_pools_the_pairs_that_differ_in_a_subset_of_the_knobs():
    """MB4 against TP (tp2 sp, mb1 -> mb4): pairs that differ in mb alone, in tp, and in mb+tp
    are pooled; a pair that also differs in pp is not (it differs in more than these
    two plans do). Median of (0.01, 0.02, 0.03, 0.05, 0.06) = 0.03."""
    sets = {frozenset({"mb"}): (0.01, 0.02), frozenset({"tp"}): (0.03,),
            frozenset({"mb", "tp"}): (0.05, 0.06), frozenset({"mb", "pp"}): (0.9, 0.9, 0.9)}
    band = replace(_err(), pairwise_errors=sets).band(TP, MB4)
    assert set(band.knobs) == {"mb", "tp"} and band.unmeasured == () and band.pairs == 5
    assert band.log == 0.03
    # too few pairs left: the absolute band, every knob counted as unmeasured
    few = replace(_err(spread=0.10), pairwise_errors={frozenset({"mb"}): (0.01,)}).band(MB4, PLAIN)
    assert few.pairs == 1 and few.unmeasured == ("mb",) and abs(few.log - math.log(1.1 / 0.9)) < 1e-12


def test_shipped_record_carries_the_pairwise_error_and_its_source():
    e = model_error(False, "bf16", "a100")
    assert "pairwise" in e.pairwise_source and "validate" in e.pairwise_source
    assert e.pairwise_errors and all(0 <= x < 5 for errs in e.pairwise_errors.values() for x in errs)
    assert frozenset({"mb"}) in e.pairwise_errors  # micro-batch sweeps of one job (BLOOM's tuning runs)
