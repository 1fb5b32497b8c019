"""A recommendation robust to the cost model's own error (issue 15 item 3).

The frontier ranks plans by the model's step time, which `meshplan validate` finds off by a few
percent to tens of percent depending on the job (src/meshplan/data/model_error.json, written by
bench/model_error.py). Part of that error is a bias shared by every plan of a class of jobs
(same GPU, precision, dense or MoE), which cannot reorder them; the rest, its spread around the
bias, can. So each frontier point carries a band of +-spread around its step time, and among the
plans whose band overlaps the band of the nominally fastest plan that fits, the recommendation
is the one that

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

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from meshplan.plan import CPMethod, Plan, Recompute, Schedule
from meshplan.shipped import shipped_json

if TYPE_CHECKING:
    from meshplan.search.planner import ScoredPlan

MIN_CLASS_ROWS = 5
"""A class of jobs with fewer validated rows falls back to the coarser class (its statistics
would be noise)."""

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

    def features(self, plan: Plan) -> tuple[str, ...]:
        """Every feature of ``FEATURES`` the plan uses."""
        return features(plan)

    def unvalidated(self, plan: Plan) -> tuple[str, ...]:
        """The plan's features that fewer than MIN_VALIDATED_ROWS published runs use."""
        return tuple(name for name, uses in FEATURES
                     if uses(plan) and self.feature_rows.get(name, 0) < MIN_VALIDATED_ROWS)


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
    return ModelError(throughput_spread=classes[t_key]["throughput_spread"], throughput_class=t_key,
                      memory_abs_p90=classes[m_key].get("memory_abs_p90", 0.0), memory_class=m_key,
                      feature_rows=dict(rec["feature_rows"]), source=rec["source"])


@dataclass(frozen=True)
class RobustChoice:
    index: int
    """Frontier index of the recommended plan."""
    nominal_index: int
    """Frontier index of the nominally fastest plan that fits (the search's own pick)."""
    band: float
    required_headroom: float
    unvalidated: tuple[str, ...]
    """Features of the recommended plan no published run validates."""
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "nominal_index": self.nominal_index, "band": self.band,
                "required_memory_headroom": self.required_headroom, "unvalidated_features": list(self.unvalidated),
                "why": self.why}


def robust_choice(frontier: Sequence["ScoredPlan"], budget_bytes: float, nominal: int | None,
                  err: ModelError) -> RobustChoice | None:
    """The recommendation among ``frontier`` (see the module doc); None when nothing fits."""
    if nominal is None:
        return None
    s, h = err.throughput_spread, err.memory_abs_p90
    fastest = frontier[nominal]
    in_band = [i for i, p in enumerate(frontier)
               if p.peak_memory_bytes <= budget_bytes and p.step_time_s * (1 - s) <= fastest.step_time_s * (1 + s)]
    roomy = [i for i in in_band if frontier[i].peak_memory_bytes * (1 + h) <= budget_bytes]
    pool = roomy or in_band

    def key(i: int) -> tuple:
        p = frontier[i]
        return (len(err.unvalidated(p.plan)), len(features(p.plan)), -(budget_bytes - p.peak_memory_bytes),
                p.step_time_s)

    best = min(pool, key=key)
    return RobustChoice(index=best, nominal_index=nominal, band=s, required_headroom=h,
                        unvalidated=err.unvalidated(frontier[best].plan),
                        why=_why(frontier, best, nominal, err, budget_bytes, bool(roomy)))


def _why(frontier, best: int, nominal: int, err: ModelError, budget_bytes: float, roomy: bool) -> str:
    b, n = frontier[best], frontier[nominal]
    band = (f"the model's error band is +-{err.throughput_spread:.1%} (spread of validate's throughput error, "
            f"class {err.throughput_class}); memory headroom asked: {err.memory_abs_p90:.1%} "
            f"(p90 memory error, class {err.memory_class})")
    if best == nominal:
        note = "" if roomy else "; no plan in the band keeps that headroom"
        return f"the fastest plan that fits is also the most robust choice ({band}{note})"
    gains = []
    lost = set(err.unvalidated(n.plan)) - set(err.unvalidated(b.plan))
    if lost:
        gains.append(f"avoids {', '.join(sorted(lost))} (fewer than {MIN_VALIDATED_ROWS} published runs validate it)")
    simpler = set(features(n.plan)) - set(features(b.plan)) - lost
    if len(features(b.plan)) < len(features(n.plan)) and simpler:
        gains.append(f"is simpler (no {', '.join(sorted(simpler))})")
    more = (n.peak_memory_bytes - b.peak_memory_bytes) / 2**30
    if n.peak_memory_bytes * (1 + err.memory_abs_p90) > budget_bytes >= b.peak_memory_bytes * (1 + err.memory_abs_p90):
        gains.append(f"keeps the headroom the memory error asks for ({more:.1f} GiB more), which #{nominal} does not")
    elif more > 0:
        gains.append(f"keeps {more:.1f} GiB more memory headroom")
    return (f"chosen over #{nominal} ({n.plan.notation()}, nominally {n.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1:.1%} "
            f"faster): within the error band it {' and '.join(gains) or 'ties'}; {band}")
