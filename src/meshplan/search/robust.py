"""A recommendation robust to the cost model's own error (issue 15 item 3).

The frontier ranks plans by the model's step time, which `meshplan validate` finds off by a few
percent to tens of percent depending on the job (src/meshplan/data/model_error.json, written by
bench/model_error.py). Two plans of the same job share most of that error (same model, GPU,
stack), so what can reorder them is the error of the model's RATIO between two layouts, which
validate measures where the published data holds several layouts of one job
(calib/pairwise.py: median |log(model ratio / measured ratio)| per knob the layouts differ in).
The band between a frontier point and the nominally fastest plan that fits is that pairwise
error of the measured pairs that differ in nothing but knobs in which the two plans differ (their
median); a knob that no such pair covers falls back to the absolute error of one step (the spread
of validate's throughput error around its class bias, on both plans). Among the plans inside their
band the recommendation is the one that

1. keeps the memory headroom the observed memory error asks for (peak x (1 + memory p90 error)
   within the budget),
2. uses the fewest features that no published run validates (the model is least sure of them),
3. then uses the fewest features at all: each is one more term of the model that can be wrong and
   one more mechanism the user must run and debug, so within the model's error the simpler plan
   is the one an expert signs (e.g. Llama-3 70B at 8K on 1024 H100: tp4 pp8 vpp5, the layout of
   NVIDIA's own Megatron-Bridge recipe, over cp2 all-to-all with a 28-chunk ragged split,
   nominally 1.6% faster),
4. then keeps the most memory headroom, then is the fastest.

The output says why it was chosen over a nominally faster plan.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from meshplan.plan.knobs import KNOB_SET_SEP, MIN_PAIRS, knobs_differing
from meshplan.plan import CPMethod, Plan, Recompute, Schedule
from meshplan.shipped import shipped_json

if TYPE_CHECKING:
    from meshplan.search.planner import ScoredPlan

MIN_CLASS_ROWS = 5
"""A class of jobs with fewer validated rows falls back to the coarser class (its statistics
would be noise)."""

MAX_SPREAD = 0.5
"""A throughput spread is a fraction below this (a larger one would make the absolute band
(1 + s) / (1 - s) unbounded)."""

MIN_VALIDATED_ROWS = 3
"""A plan feature used by fewer published runs than this is one the model is least sure of."""

FEATURES: tuple[tuple[str, Callable[[Plan], bool]], ...] = (
    ("context parallel", lambda p: p.dims.cp > 1),
    ("all-to-all context parallel", lambda p: p.dims.cp > 1 and p.cp_method == CPMethod.ALL_TO_ALL),
    ("expert parallel", lambda p: p.dims.ep > 1),
    ("expert tensor parallel", lambda p: p.dims.etp not in (0, p.dims.tp)),
    ("ZeRO-2", lambda p: p.zero == 2 and p.dims.dp_shard * p.dims.cp > 1),
    ("ZeRO-3", lambda p: p.zero == 3 and p.dims.dp_shard * p.dims.cp > 1),
    ("hybrid sharding", lambda p: p.dims.dp_replicate > 1 and p.dims.dp_shard > 1),
    ("interleaved pipeline", lambda p: p.dims.pp > 1 and p.vpp > 1),
    ("zero-bubble schedule", lambda p: p.dims.pp > 1 and p.schedule == Schedule.ZERO_BUBBLE),
    ("GPipe schedule", lambda p: p.dims.pp > 1 and p.schedule == Schedule.GPIPE),
    ("selective recompute", lambda p: p.recompute == Recompute.SELECTIVE),
    ("partial recompute", lambda p: p.recompute != Recompute.NONE and bool(p.recompute_layers)
     and tuple(p.recompute_layers) != tuple(p.stage_layers)),
    ("uneven layer split", lambda p: len(set(p.stage_layers)) > 1),
)
"""Plan features the validation data may or may not cover (counted by bench/model_error.py)."""


def features(plan: Plan) -> tuple[str, ...]:
    """The names of the ``FEATURES`` ``plan`` uses."""
    return tuple(name for name, uses in FEATURES if uses(plan))


def class_keys(is_moe: bool, precision: str, gpu_family: str) -> tuple[str, ...]:
    """A job's error classes, the most specific first, ending with every row ("all")."""
    arch = "moe" if is_moe else "dense"
    return (f"{arch}/{precision}/{gpu_family}", f"{arch}/{gpu_family}", gpu_family, "all")


@dataclass(frozen=True)
class Band:
    """How far the model's step ratio between two plans of one job can be off."""

    log: float
    """log of the largest ratio error taken as a tie."""
    knobs: tuple[str, ...]
    """The knobs the two plans differ in that measured pairs cover."""
    unmeasured: tuple[str, ...]
    """Those no measured pair covers (then ``log`` is the absolute band of one step on both plans);
    all the knobs when too few pairs are left."""
    pairs: int
    """Measured pairs pooled."""

    @property
    def fraction(self) -> float:
        return math.expm1(self.log)


@dataclass(frozen=True)
class ModelError:
    """What validate measured for the class of a job."""

    throughput_spread: float
    """Median |error - median error| of throughput: the band half-width (fraction)."""
    throughput_class: str
    memory_abs_p90: float
    """p90 |memory error| (fraction): the headroom a plan keeps on top of its peak."""
    memory_class: str
    feature_rows: dict[str, int]
    source: str
    pairwise_errors: Mapping[frozenset[str], tuple[float, ...]] = field(default_factory=dict)
    """|log(model ratio / measured ratio)| of the pairs of measured layouts of one job, by the set
    of knobs (calib/pairwise.py KNOBS) the two layouts differ in."""
    pairwise_source: str = ""

    @property
    def absolute_log_band(self) -> float:
        """The band when no pair measures a knob: each plan's step off by +-spread, so the ratio
        by up to (1 + spread) / (1 - spread)."""
        s = min(self.throughput_spread, MAX_SPREAD)
        return math.log((1 + s) / (1 - s))

    def band(self, a: Plan, b: Plan) -> "Band":
        """The band of the model's ratio a / b: the median error of the measured pairs that differ
        in nothing but knobs in which ``a`` and ``b`` differ (at least MIN_PAIRS of them, and every
        such knob measured by one); the absolute band where a knob is not (0 between equal layouts)."""
        knobs = knobs_differing(a, b)
        if not knobs:
            return Band(0.0, (), (), 0)
        mine = set(knobs)
        sets = [(ks, errs) for ks, errs in self.pairwise_errors.items() if ks <= mine and errs]
        covered = set().union(*(ks for ks, _ in sets))
        errs = sorted(e for _, es in sets for e in es)
        unmeasured = tuple(k for k in knobs if k not in covered)
        if unmeasured or len(errs) < MIN_PAIRS:
            return Band(self.absolute_log_band, tuple(k for k in knobs if k in covered), unmeasured or knobs, len(errs))
        return Band(statistics.median(errs), knobs, (), len(errs))

    def features(self, plan: Plan) -> tuple[str, ...]:
        """Every feature of ``FEATURES`` the plan uses."""
        return features(plan)

    def unvalidated(self, plan: Plan) -> tuple[str, ...]:
        """The plan's features that fewer than MIN_VALIDATED_ROWS published runs use."""
        return tuple(name for name, uses in FEATURES
                     if uses(plan) and self.feature_rows.get(name, 0) < MIN_VALIDATED_ROWS)


def keeps_headroom(fit_bytes: float, budget_bytes: float, memory_error: float) -> bool:
    """Whether a plan whose fit figure (cost.device_memory.fit_bytes) is ``fit_bytes`` stays within
    ``budget_bytes`` when the model underestimates it by the observed memory error (a fraction):
    point 1 of the module docstring, and search/memory_margin.py's report of it."""
    return fit_bytes * (1.0 + memory_error) <= budget_bytes


@lru_cache(maxsize=1)
def _record() -> Mapping[str, Any]:
    return shipped_json("meshplan.data", "model_error.json")


def model_error(is_moe: bool, precision: str, gpu_family: str) -> ModelError:
    """The error record of the most specific class with enough rows (``MIN_CLASS_ROWS``)."""
    rec = _record()
    classes = rec["classes"]
    keys = class_keys(is_moe, precision, gpu_family)
    t_key = next(k for k in keys if classes.get(k, {}).get("rows", 0) >= MIN_CLASS_ROWS or k == "all")
    m_key = next(k for k in keys if classes.get(k, {}).get("memory_rows", 0) >= MIN_CLASS_ROWS or k == "all")
    pw = rec.get("pairwise", {})
    sets = {frozenset(k.split(KNOB_SET_SEP)): tuple(v) for k, v in pw.get("by_knob_set", {}).items()}
    return ModelError(throughput_spread=classes[t_key]["throughput_spread"], throughput_class=t_key,
                      memory_abs_p90=classes[m_key].get("memory_abs_p90", 0.0), memory_class=m_key,
                      feature_rows=dict(rec["feature_rows"]), source=rec["source"],
                      pairwise_errors=sets, pairwise_source=pw.get("source", ""))


@dataclass(frozen=True)
class RobustChoice:
    index: int
    """Frontier index of the recommended plan."""
    nominal_index: int
    """Frontier index of the nominally fastest plan that fits (the search's own pick)."""
    band: float
    """The band (fraction) the recommended plan was held to against the nominal one: exp(log band) - 1."""
    required_headroom: float
    unvalidated: tuple[str, ...]
    """Features of the recommended plan no published run validates."""
    why: str
    band_knobs: tuple[str, ...] = ()
    """The knobs the recommended and the nominal plan differ in that pairs of measured layouts
    measure (their pairwise error set the band)."""
    unmeasured_knobs: tuple[str, ...] = ()
    """The knobs they differ in that no pair measures (the absolute error set the band)."""

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "nominal_index": self.nominal_index, "band": self.band,
                "band_knobs": list(self.band_knobs), "unmeasured_knobs": list(self.unmeasured_knobs),
                "required_memory_headroom": self.required_headroom, "unvalidated_features": list(self.unvalidated),
                "why": self.why}


def robust_choice(frontier: Sequence["ScoredPlan"], budget_bytes: float, nominal: int | None,
                  err: ModelError) -> RobustChoice | None:
    """The recommendation among ``frontier`` (see the module doc); None when nothing fits."""
    if nominal is None:
        return None
    h = err.memory_abs_p90
    fastest = frontier[nominal]
    bands = {i: err.band(p.plan, fastest.plan) for i, p in enumerate(frontier)
             if p.peak_memory_bytes <= budget_bytes}
    in_band = [i for i, band in bands.items()
               if math.log(frontier[i].step_time_s / fastest.step_time_s) <= band.log]
    roomy = [i for i in in_band if keeps_headroom(frontier[i].peak_memory_bytes, budget_bytes, h)]
    pool = roomy or in_band

    def key(i: int) -> tuple:
        p = frontier[i]
        return (len(err.unvalidated(p.plan)), len(features(p.plan)), -(budget_bytes - p.peak_memory_bytes),
                p.step_time_s)

    best = min(pool, key=key)
    band = bands[best]
    return RobustChoice(index=best, nominal_index=nominal, band=band.fraction, required_headroom=h,
                        unvalidated=err.unvalidated(frontier[best].plan),
                        why=_why(frontier, best, nominal, err, budget_bytes, bool(roomy)),
                        band_knobs=band.knobs, unmeasured_knobs=band.unmeasured)


def band_text(err: ModelError, band: Band) -> str:
    """What ``band`` rests on, in words."""
    if not band.knobs and not band.unmeasured:
        return "the same layout"
    if band.unmeasured:
        lacking = (f"no pair of measured layouts separates {', '.join(band.unmeasured)}" if band.pairs >= MIN_PAIRS
                   else f"fewer than {MIN_PAIRS} pairs of measured layouts differ in {', '.join(band.unmeasured)} alone")
        return (f"{lacking}, so the band is the absolute error of one step on both plans (spread of validate's "
                f"throughput error, class {err.throughput_class})")
    return (f"the model's ratio between two measured layouts of one job that differ in {', '.join(band.knobs)} "
            f"(or some of them) is off by {band.fraction:.1%}, median of {band.pairs} pairs "
            f"(`meshplan validate` pairwise table)")


def band_basis(err: ModelError, a: Plan, b: Plan) -> tuple[float, str]:
    """(band as a fraction, what it rests on) between plans ``a`` and ``b`` (`plan --compare`)."""
    band = err.band(a, b)
    return band.fraction, band_text(err, band)


def _why(frontier, best: int, nominal: int, err: ModelError, budget_bytes: float, roomy: bool) -> str:
    b, n = frontier[best], frontier[nominal]
    memory = f"memory headroom asked: {err.memory_abs_p90:.1%} (p90 memory error, class {err.memory_class})"
    if best == nominal:
        note = "" if roomy else "; no plan in the band keeps that headroom"
        return f"the fastest plan that fits is also the most robust choice ({memory}{note})"
    band = err.band(b.plan, n.plan)
    gains = []
    lost = set(err.unvalidated(n.plan)) - set(err.unvalidated(b.plan))
    if lost:
        gains.append(f"avoids {', '.join(sorted(lost))} (fewer than {MIN_VALIDATED_ROWS} published runs validate it)")
    simpler = set(features(n.plan)) - set(features(b.plan)) - lost
    if len(features(b.plan)) < len(features(n.plan)) and simpler:
        gains.append(f"is simpler (no {', '.join(sorted(simpler))})")
    more = (n.peak_memory_bytes - b.peak_memory_bytes) / 2**30
    h = err.memory_abs_p90
    if not keeps_headroom(n.peak_memory_bytes, budget_bytes, h) and keeps_headroom(b.peak_memory_bytes, budget_bytes, h):
        gains.append(f"keeps the headroom the memory error asks for ({more:.1f} GiB more), which #{nominal} does not")
    elif more > 0:
        gains.append(f"keeps {more:.1f} GiB more memory headroom")
    gap = b.step_time_s / n.step_time_s - 1
    return (f"chosen over #{nominal} ({n.plan.notation()}, nominally {gap:.1%} faster, within the band of "
            f"{band.fraction:.1%}: {band_text(err, band)}): within that band it "
            f"{' and '.join(gains) or 'ties'}; {memory}")
