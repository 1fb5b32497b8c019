"""One search per job of bench/bench_experts.py and its recommended plan against each published
plan of the job (issue 15 item 5): the rows of docs/experts.md before rendering."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.calib.validate import Run
from meshplan.cost import estimate
from meshplan.cost.calibration import gpu_family
from meshplan.report.attribution import attribute
from meshplan.search.planner import search
from meshplan.search.robust import model_error, robust_choice
from meshplan.search.space_membership import why_outside
from meshplan.targets import Target, search_options

from experts_evidence import run_calibration  # bench/ is the script's directory, on sys.path

TOP_TERMS = 3
STACK = Target.MEGATRON


@dataclass(frozen=True)
class Row:
    csv: str
    row_id: str
    model: str
    gpu: str
    gpus: int
    seq: int
    batch: int
    published: str
    recommended: str | None
    ratio: float | None
    nominal_ratio: float | None
    """Against the nominally fastest plan that fits (before the robust choice)."""
    published_fits: bool
    outside: str | None
    terms: str
    term_deltas: dict
    published_recompute: str
    old_stack: bool
    """The published stack predates selective recompute and sequence parallel."""
    budget_gib: float
    recommended_gib: float | None
    band: float | None = None
    """The robust recommendation's band between the recommended and the published plan (fraction):
    the pairwise ratio error of the knobs they differ in, or the absolute error where no pair
    measures one (``ModelError.band``)."""
    band_knobs: str = ""
    """The knobs they differ in; those no pair of measured layouts measures marked '(no pairs)'."""


def published_stack_predates_selective(run: Run) -> bool:
    """The row ran full recompute without sequence parallel on a stack of before Megatron-LM v3.0
    (2022), which brought selective recompute and sequence parallel together (Korthikanti et al.
    2022): Megatron-LM 2020-22 and BigScience's Megatron-DeepSpeed. Such a row could not have
    used what the search recommends instead."""
    return (run.settings.get("fused_attention") is False and run.plan.recompute.value == "full"
            and not run.plan.sp)


def compare_job(csv: str, runs: list[Run]) -> list[Row]:
    """One search for the job the ``runs`` share, each run's published plan against its pick."""
    first = runs[0]
    calib = run_calibration(first)
    opts = search_options(STACK, first.model, first.training)
    res = search(first.model, first.cluster, first.training, calib=calib, options=opts)
    choice = err = None
    if res.recommended is not None:
        err = model_error(first.model.is_moe, first.training.precision.value, gpu_family(first.cluster.gpu))
        choice = robust_choice(res.frontier, res.budget_bytes, res.recommended_index, err)
    rec = None if choice is None else estimate(first.model, first.cluster, first.training,
                                                 res.frontier[choice.index].plan, calib)
    rows = []
    for run in runs:
        pub = estimate(run.model, run.cluster, run.training, run.plan, calib)
        common = dict(csv=csv, row_id=run.row_id, model=run.model.name, gpu=run.cluster.gpu.name,
                      gpus=run.cluster.num_gpus, seq=run.training.seq_len, batch=run.training.global_batch,
                      published=run.plan.notation(), published_fits=pub.peak_memory_gib * 2**30 <= res.budget_bytes,
                      outside=why_outside(run.model, run.training, run.cluster.num_gpus, run.plan, opts),
                      published_recompute=run.plan.recompute.value,
                      old_stack=published_stack_predates_selective(run),
                      budget_gib=res.budget_bytes / 2**30)
        if rec is None:
            rows.append(Row(**common, recommended=None, ratio=None, nominal_ratio=None,
                            terms="nothing fits the budget", term_deltas={}, recommended_gib=None))
            continue
        att = attribute(pub, rec)
        band = err.band(rec.plan, run.plan)
        rows.append(Row(**common, recommended=rec.plan.notation(), ratio=pub.step_time_s / rec.step_time_s,
                        band=band.fraction, band_knobs=", ".join(band.knobs + tuple(f"{k} (no pairs)" for k in band.unmeasured)),
                        nominal_ratio=pub.step_time_s / res.recommended.step_time_s,
                        terms=att.explain(TOP_TERMS), recommended_gib=rec.peak_memory_gib,
                        term_deltas={t.term: t.delta_s / pub.step_time_s for t in att.terms}))
    return rows
