"""What the measurements say about a gain of bench/bench_experts.py: the published run's measured
step, other measured layouts of the same job (siblings), and a verdict per large gain (issue 15
item 5). Rows are ``experts_compare.Row``; runs are read once per process."""

from __future__ import annotations

import csv as csvmod
import statistics
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from meshplan.calib.pairwise import MEASURED_TIE, knobs_differing, release
from meshplan.calib.validate import Run, load_runs, predicted_metric, setting_calibration
from meshplan.cost import estimate
from meshplan.data.published import PUBLISHED_RUNS, runs_csv
from meshplan.report.attribution import attribute
from experts_mb_pairs import MicroBatchPair, micro_batch_evidence, micro_batch_pairs  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from experts_compare import Row

LARGE_GAIN = 1.15
"""Ratios above this get their terms listed and a verdict (the issue's threshold)."""


def run_calibration(run: Run):
    """The calibration ``meshplan validate`` estimates the row with (calib/validate.py
    ``evaluate``): the row's framework settings and the presets of the stack release it ran
    (``Run.release_values``: a 26.x Megatron-Bridge recipe's full-iteration CUDA graph, fused
    grouped MLP, ...). Without the release's presets a graphed run would pay the launch and
    dispatch costs its graph removes, and a gain from a larger micro-batch would come from them."""
    return setting_calibration(run, None, {**run.settings, **run.release_values})


@cache
def _runs_by_id(csv: str) -> dict[str, Run]:
    """The CSV's buildable runs by row id (each worker process reads them once: runs do not pickle)."""
    return {r.row_id: r for r in load_runs(runs_csv(csv))[0]}


def measured_step_s(run: Run, est_step_s: float) -> float | None:
    """The step time the row's measured metric stands for (throughput metrics scale as 1/step)."""
    if run.measured is None or run.metric is None:
        return None
    if run.metric == "step_time_s":
        return run.measured
    return est_step_s * predicted_metric(run, est_step_s) / run.measured


def _steps_of(run: Run) -> tuple[float, float | None]:
    """(model step time, measured step time) of a published run."""
    return _steps_by_id(run.row_id, run.source, run.plan.notation(), run.cluster.num_gpus)


@cache
def _steps_by_id(row_id: str, source: str, notation: str, gpus: int) -> tuple[float, float | None]:
    run = next(r for csv in PUBLISHED_RUNS for r in _runs_by_id(csv).values()
               if (r.row_id, r.source, r.plan.notation(), r.cluster.num_gpus) == (row_id, source, notation, gpus))
    est = estimate(run.model, run.cluster, run.training, run.plan, run_calibration(run))
    return est.step_time_s, measured_step_s(run, est.step_time_s)


def measured_ratio(row: Row) -> float | None:
    """The ratio with the published plan's measured step in place of its estimate (the
    recommended plan's estimate kept): the part of the gain that does not come from the model's
    error on the published plan itself."""
    est, measured = _steps_of(_runs_by_id(row.csv)[row.row_id])
    return None if measured is None or row.ratio is None else row.ratio * measured / est


@dataclass(frozen=True)
class Sibling:
    """The fastest measured run of the same job with another layout (a gain the data shows)."""

    measured: float
    """This run's measured step over the sibling's (above 1: the sibling ran faster)."""
    row_id: str
    model: float | None
    """The cost model's ratio of the same two layouts (None: the sibling's layout is not given,
    so the model cannot build it)."""
    same_release: bool
    """Both rows come from the same source (paper table, or Megatron-Bridge container release):
    across releases a regression or a fix of the stack is not separated from the layout."""

    def cell(self) -> str:
        model = "layout not given" if self.model is None else f"model {self.model:.2f}"
        note = "" if self.same_release else ", another release"
        return f"{self.measured:.2f} (row {self.row_id}; {model}{note})"


def measured_sibling_ratio(row: Row) -> str:
    """``measured_sibling`` as a table cell."""
    sib = measured_sibling(row)
    return "-" if sib is None else sib.cell()


@cache
def _raw_rows(csv: str) -> dict[str, dict[str, str]]:
    """The CSV's records by id, the ones the model cannot build included."""
    with open(runs_csv(csv), newline="") as fh:
        return {r["id"]: r for r in csvmod.DictReader(fh)}


RAW_JOB = ("model", "gpu", "num_gpus", "seq_len", "global_batch_size", "precision", "flops_basis")
"""Columns two CSV records share when they are the same job measured on the same basis."""


def unbuilt_sibling(row: Row) -> Sibling | None:
    """The fastest run of the same job (same CSV columns ``RAW_JOB``) that the model cannot build
    (its layout is not given: e.g. Narayanan et al. 2021 Table 2's PTD-P rows), by measured
    TFLOP/s per GPU (the same FLOPs per step on both sides, so their ratio is the step ratio)."""
    raw = _raw_rows(row.csv)
    me = raw.get(row.row_id)
    built = _runs_by_id(row.csv)
    if me is None or not me.get("measured_tflops_per_gpu"):
        return None
    sibs = [r for i, r in raw.items() if i not in built and r.get("measured_tflops_per_gpu")
            and all(r[c] == me[c] for c in RAW_JOB)]
    best = max(sibs, key=lambda r: float(r["measured_tflops_per_gpu"]), default=None)
    if best is None:
        return None
    return Sibling(measured=float(best["measured_tflops_per_gpu"]) / float(me["measured_tflops_per_gpu"]),
                   row_id=best["id"], model=None, same_release=release(best["source"]) == release(me["source"]))


def measured_sibling(row: Row) -> Sibling | None:
    """This run's measured step over the fastest measured run of the same job (model, GPU, GPU
    count, sequence, batch, precision) with another layout in the same CSV: a gain the data
    itself shows. Runs of the same release first (a Megatron-Bridge container, a paper's table),
    other releases only where none is measured."""
    runs = _runs_by_id(row.csv)
    me = runs[row.row_id]
    job = lambda r: (r.model.name, r.cluster.gpu.name, r.cluster.num_gpus, r.training.seq_len,
                     r.training.global_batch, r.training.precision)
    sibs = [r for r in runs.values() if job(r) == job(me) and r.plan.notation() != me.plan.notation()]
    est_mine, mine = _steps_of(me)
    if mine is None:
        return None
    measured = [(_steps_of(r), r) for r in sibs]
    measured = [(st, r) for st, r in measured if st[1] is not None]
    same = [(st, r) for st, r in measured if release(r.source) == release(me.source)]
    best = min(same or measured, default=None, key=lambda sr: sr[0][1])
    if best is None:
        return unbuilt_sibling(row)
    (est_best, meas_best), r = best
    return Sibling(measured=mine / meas_best, row_id=r.row_id, model=est_mine / est_best,
                   same_release=release(r.source) == release(me.source))


def contradicted(sib: Sibling) -> bool:
    """The model ranks the two measured layouts the other way round from the measurements, by
    more than LARGE_GAIN - 1, both measured on one release (across releases the same layout of a
    job differs by up to 1.8x: 'Releases, the layout fixed' in docs/experts.md, so a reversal
    there does not point at a term of the model)."""
    return (sib.model is not None and sib.same_release and (sib.measured < 1) != (sib.model < 1)
            and abs(sib.model - sib.measured) > LARGE_GAIN - 1)


def ordering(row: Row, sib: Sibling) -> tuple[str, str, float]:
    """(knobs the row's layout and its measured sibling differ in (calib/pairwise.py), the term of
    the model's difference between them that pushes its order against the measured one the most
    (report/attribution.py), that term's share of the sibling's step)."""
    runs = _runs_by_id(row.csv)
    me, other = runs[row.row_id], runs[sib.row_id]
    est = lambda r: estimate(r.model, r.cluster, r.training, r.plan, run_calibration(r))
    base = est(other)
    terms = attribute(base, est(me)).terms  # this layout's step - the sibling's, per term
    wrong = 1.0 if sib.measured < 1 else -1.0  # measured faster: the terms that make it slower are the wrong ones
    worst = max(terms, key=lambda t: wrong * t.delta_s)
    return ", ".join(knobs_differing(me.plan, other.plan)), worst.term, worst.delta_s / base.step_time_s


def ordering_term(row: Row, sib: Sibling) -> str:
    """``ordering`` in words."""
    knobs, term, share = ordering(row, sib)
    return f"layouts differ in {knobs}; the model's difference is led by {term} {share:+.1%} of the step"


def _largest_term(row: Row) -> str:
    return min(row.term_deltas.items(), key=lambda kv: kv[1])[0]


def _micro_batch(notation: str) -> int:
    """The micro-batch size in a plan's notation (``... mb4 ...``)."""
    return next(int(tok[2:]) for tok in notation.split() if tok.startswith("mb") and tok[2:].isdigit())


def verdict(row: Row) -> tuple[str, str]:
    """(class, reason) of a large gain: what the data says about it (first that applies)."""
    sib = measured_sibling(row)
    if sib is not None and contradicted(sib):
        return "contradicted", (f"row {sib.row_id} measured {sib.measured:.2f}, model {sib.model:.2f}; "
                                f"{ordering_term(row, sib)}")
    if sib is not None and sib.measured > LARGE_GAIN:
        return ("measured" if sib.same_release else "measured (another release)"), sib.cell()
    top = _largest_term(row)
    if row.old_stack and top == "recompute":
        return "technique", "full recompute on a stack before selective recompute (2022)"
    against_measured = measured_ratio(row)
    if against_measured is not None and against_measured <= LARGE_GAIN:
        return "model error", (f"{against_measured:.2f} against the published run's measured step (largest term "
                               f"{top}): the model is slower than the measurement on the published plan")
    if not row.published_fits:
        return "over budget", "the model puts the published plan over the memory budget"
    run = _runs_by_id(row.csv)[row.row_id]
    if run.model.is_moe and top == "compute" and row.recommended and (
            _micro_batch(row.recommended) > run.plan.micro_batch):
        calib = run_calibration(run)
        dropless = run.training.moe_capacity_factor is None and run.training.moe_dispatcher.value == "alltoall"
        sync = (f", the dropless all-to-all's host sync {calib.moe_alltoall_sync_s * 1e3:.1f} ms per MoE layer"
                if dropless and calib.moe_alltoall_sync_s else "")
        contested, evidence = micro_batch_evidence(run)
        return ("contested" if contested else "unsupported"), (
            f"larger micro-batch (mb{run.plan.micro_batch} -> mb{_micro_batch(row.recommended)}) "
            f"amortises the fixed costs per micro-batch: {calib.layer_overhead_s * 1e3:.1f} ms per "
            f"layer{sync} (fitted, cost/layer.py); {evidence}")
    return "unsupported", f"largest term {top}"


VERDICT_TEXT = {
    "measured": "the data holds another layout of the same job, from the same source (paper table or "
                "container release), measured faster by more than the threshold: the published layout was "
                "not the fastest even by the measurements",
    "measured (another release)": "the faster measured layout of the same job ran on another release "
                                  "(container, or publication): the gain is measured, but a release's regression or fix is not "
                                  "separated from the layout",
    "technique": "the published run predates the feature that makes the gain (selective recompute and "
                 "sequence parallel, Korthikanti et al. 2022); see the next section",
    "model error": "against the published run's measured step (in place of its estimate) the gain is "
                   f"{LARGE_GAIN} or less: the model over-charges the published plan itself by about the gain",
    "over budget": "the model puts the published plan over the memory budget (it ran), so the comparison "
                   "is with a plan held to a stricter limit; the ratio rests on the memory model",
    "contradicted": "the model orders two measured layouts of the job against the measurements: a term is "
                    "wrong for this job, the ratio is not to be trusted",
    "contested": "the gain comes from a larger micro-batch amortising the fixed per-layer costs, and the "
                 "measured pairs of layouts that differ in the micro-batch on the same GPU generation show the "
                 f"model crediting the larger micro-batch by more than {MEASURED_TIE:.0%} beyond the "
                 "measurements (dense Llama 3 70B, mb1 against mb2): the term the gain rests on, the per-layer "
                 "overhead charged as device time, is in doubt, and a gain from a step of mb1 -> mb8 or more "
                 "compounds it (docs/accuracy.md, sessions 10-11). Where a larger micro-batch was measured on the "
                 "same job (Qwen3-30B on 8 B200, 'measured (another release)') the gain is real",
    "unsupported": "no measurement of the job in another layout: the gain rests on the model alone",
}


def verdict_section(big: list[Row]) -> list[str]:
    """Which large gains the measurements support, which come from techniques the published run
    did not have, and which rest on the model alone."""
    classes: dict[str, list[tuple[Row, str]]] = {}
    for r in big:
        cls, why = verdict(r)
        classes.setdefault(cls, []).append((r, why))
    out = ["", "## Verdict on the large gains", "",
           f"Each of the {len(big)} ratios above {LARGE_GAIN} (table below) in one class, the first that applies. "
           "'Against the measured step': the ratio with the published run's measured step in place of the "
           "model's estimate of it.", "",
           "| class | rows | what it means |", "|---|---:|---|"]
    out += [f"| {cls} | {len(classes.get(cls, []))} | {text} |" for cls, text in VERDICT_TEXT.items()]
    for cls in VERDICT_TEXT:
        if cls == "technique" or not classes.get(cls):
            continue
        groups: dict[tuple, list[tuple[Row, str]]] = {}
        for r, why in classes[cls]:
            groups.setdefault((r.model, r.gpus, r.gpu, why if cls in ("unsupported", "contested") else ""), []).append((r, why))
        out += ["", f"**{cls}** ({len(classes[cls])} rows):", ""]
        for (model, gpus, gpu, _), items in sorted(groups.items(), key=lambda kv: -max(r.ratio for r, _ in kv[1])):
            ids = ", ".join(f"{r.csv[:5]} {r.row_id}" for r, _ in items)
            against = [x for r, _ in items if (x := measured_ratio(r)) is not None]
            vs = "" if not against or cls == "model error" else f"; {_span(against)} against the measured step"
            out.append(f"- {model}, {gpus} x {gpu}: ratio {_span([r.ratio for r, _ in items])}{vs} ({ids}): "
                       f"{items[0][1]}")
    return out + _ordering_summary(classes.get("contradicted", [])) + _release_spread() + _ep_domain_errors()


def _ordering_summary(items: list[tuple[Row, str]]) -> list[str]:
    """The contradicted rows by what their two measured layouts differ in and the term that leads
    the model's wrong order."""
    if not items:
        return []
    tally: dict[tuple[str, str], list[str]] = {}
    for r, _ in items:
        knobs, term, _share = ordering(r, measured_sibling(r))
        tally.setdefault((knobs, term), []).append(f"{r.csv[:5]} {r.row_id}")
    return ["", f"What orders the {len(items)} contradicted pairs wrongly (knobs the two measured layouts differ in: "
            "the term leading the model's difference against the measured order): "
            + "; ".join(f"{knobs}: {term} ({len(ids)}: {', '.join(ids)})"
                        for (knobs, term), ids in sorted(tally.items(), key=lambda kv: -len(kv[1]))) + ". "
            f"{sum(len(ids) for (_, term), ids in tally.items() if term == 'bubble')} of them are led by the pipeline "
            "bubble: the layout with more micro-batches (a smaller micro-batch at the same global batch, or more "
            "stages) gets a smaller bubble share in the model, while the measurements found the larger micro-batch "
            "faster: the per-micro-batch costs of that stack (fixed costs per micro-batch, GEMM efficiency at a small "
            "micro-batch) are under-charged for it. Recorded, not fixed in cost/: the per-micro-batch cost is a "
            "fitted term (calib/fit*.py) and no cited mechanism of the stack separates it; `meshplan validate`'s "
            "pairwise table shows the same on the whole set (pairs that differ in the micro-batch alone: misordered "
            "column), and the recommendation's band for those knobs is that error."]


def _span(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{xs[0]:.2f}" if xs[-1] - xs[0] < 0.005 else f"{xs[0]:.2f}-{xs[-1]:.2f}"


def _release_spread(top: int = 5) -> list[str]:
    """The same published layout of the same job measured on several Megatron-Bridge releases:
    how far apart the releases are (a release's effect, with the layout fixed)."""
    groups: dict[tuple, list[tuple[float, Run]]] = {}
    for r in _runs_by_id("megatron-bridge").values():
        step = _steps_of(r)[1]
        if step is None:
            continue
        key = (r.model.name, r.cluster.gpu.name, r.cluster.num_gpus, r.training.seq_len, r.training.global_batch,
               r.training.precision, r.plan.notation())
        groups.setdefault(key, []).append((step, r))
    first = lambda x: x[0]
    spread = sorted(((max(g, key=first)[0] / min(g, key=first)[0], max(g, key=first)[1], min(g, key=first)[1])
                     for g in groups.values() if len({release(r.source) for _, r in g}) > 1),
                    key=lambda x: -x[0])
    if not spread:
        return []
    return ["", f"Releases, the layout fixed: of {len(spread)} published layouts measured on more than one "
            f"Megatron-Bridge release, {sum(x > LARGE_GAIN for x, _, _ in spread)} differ by more than "
            f"{LARGE_GAIN - 1:.0%} between releases; the largest: "
            + ", ".join(f"{slow.model.name} on {slow.cluster.num_gpus} x {slow.cluster.gpu.name} "
                        f"{x:.2f}x (row {slow.row_id}, {slow.source.split()[-1]} against row {fast.row_id}, "
                        f"{fast.source.split()[-1]})" for x, slow, fast in spread[:top])
            + ". A gain measured across releases ('measured (another release)') may be the release's, not "
              "the layout's."]


def _ep_domain_errors() -> list[str]:
    """The model's step over the measured one for the published MoE plans whose expert group
    crosses the scale-up domain (NICs) and those inside it (NVLink)."""
    sides: dict[bool, list[tuple[float, Run]]] = {True: [], False: []}
    for r in _runs_by_id("megatron-bridge").values():
        if not r.model.is_moe:
            continue
        est, measured = _steps_of(r)
        if measured is None:
            continue
        d = r.plan.dims
        span = d.ep * (d.etp if d.etp else d.tp)  # ranks of one expert group, etp innermost
        sides[span > r.cluster.scale_up_gpus].append((est / measured, r))
    if not sides[True]:
        return []
    cross = sorted(sides[True], key=lambda x: -x[0])
    worst = [f"row {r.row_id} {r.model.name} {r.cluster.gpu.name} ep{r.plan.dims.ep} {x - 1:+.0%}"
             for x, r in cross if x > LARGE_GAIN]
    med = lambda xs: statistics.median(x for x, _ in xs) - 1
    return ["", f"Expert all-to-all over the NICs: on the {len(cross)} published MoE plans whose expert group "
            f"crosses the scale-up domain the model's step is {med(cross):+.1%} off the measured one (median; "
            f"{med(sides[False]):+.1%} on the {len(sides[False])} inside one domain), but "
            f"{len(worst)} are more than {LARGE_GAIN - 1:.0%} too slow: {', '.join(worst) or 'none'}. On those jobs "
            "the model over-charges the cross-node all-to-all (or misses an overlap or dispatcher their presets ran), "
            "so gains that move the expert group inside a node are overstated by as much: the table's column "
            "'ratio against the published run's measured step' takes that error out."]
