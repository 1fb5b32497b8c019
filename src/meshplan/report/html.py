"""One self-contained HTML report for a planning run: inline PNG charts (base64), tables, no
external assets (no scripts, fonts or stylesheets fetched), so it can be mailed or archived.

Sections: what is trained where; the comparison with a given plan (if any); the frontier plot
and table; for the chosen plan, the per-rank memory chart and table and the step timeline.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from meshplan.report.memory_chart import PARTS, memory_png, memory_rows_gib
from meshplan.report.timeline import step_timeline, timeline_png

if TYPE_CHECKING:
    from meshplan.cost.step import Estimate
    from meshplan.plan import Job
    from meshplan.report.compare import Comparison, CostPoint

TIMELINE_MAX_MICROBATCHES = 256
"""Most micro-batches per step the timeline draws: each is a labelled bar per stage and pass, and
drawing them costs ~0.04 s per micro-batch on 4 pipeline ranks (a Llama-3-8B pp4 report: 5.5 s at
32 micro-batches, 13.6 s at 256, 48 s at 1024, 200 s at 4096; 10^7 hung it; session 8). 256 covers
the published pipelined runs (GPT-3 175B, Narayanan 2021: 192). Above it the section says so; the
cost model's step time stands."""

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f5f5f5; } td.l, th.l { text-align: left; font-family: ui-monospace, monospace; }
tr.chosen { background: #fff4d6; font-weight: 600; } tr.yours { background: #e8e8ff; } tr.over { color: #999; }
img { max-width: 100%; border: 1px solid #eee; }
.summary { background: #eef5ff; padding: 0.7em 1em; border-left: 4px solid #4C78A8; }
.muted { color: #777; font-size: 0.85em; }
"""


@dataclass(frozen=True)
class ReportInput:
    title: str
    job: "Job"
    """The chosen plan with what is trained and where."""
    estimate: "Estimate"
    """The cost model's estimate of the chosen plan."""
    frontier: Sequence["CostPoint"] = ()
    chosen_index: int | None = None
    """Row of the frontier that is the chosen plan (highlighted), if it is on it."""
    recommended_index: int | None = None
    """Row of the fastest plan within the budget (marked)."""
    budget_gib: float | None = None
    frontier_png: bytes | None = None
    comparison: "Comparison | None" = None
    yours: "CostPoint | None" = None
    """The user's plan: drawn on the plot and listed in the frontier table where it falls."""
    notes: Sequence[str] = ()


def _img(png: bytes, ident: str, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img id="{ident}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f'<tr><th class="l">{html.escape(k)}</th><td class="l">{html.escape(v)}</td></tr>'
                   for k, v in rows)
    return f"<table>{body}</table>"


def _frontier_table(data: ReportInput) -> str:
    head = ("<tr><th>#</th><th class='l'></th><th class='l'>plan</th><th>step s</th><th>tok/s/GPU</th><th>MFU</th>"
            "<th>peak GiB</th><th>fits</th></tr>")
    rows = []
    yours = data.yours
    yours_row = None if yours is None else (
        f'<tr class="yours" id="yours-row"><td></td><td class="l">&#9670; yours</td>'
        f'<td class="l">{html.escape(yours.plan.notation())}</td><td>{yours.step_time_s:.3f}</td>'
        f"<td>{yours.tokens_per_s_per_gpu:,.0f}</td><td>{_mfu(yours)}</td><td>{yours.peak_memory_gib:.1f}</td>"
        f"<td>{'yes' if data.budget_gib is None or yours.peak_memory_gib <= data.budget_gib else 'no'}</td></tr>")
    for i, p in enumerate(data.frontier):
        if yours_row is not None and p.step_time_s > yours.step_time_s:  # in step-time order
            rows.append(yours_row)
            yours_row = None
        fits = data.budget_gib is None or p.peak_memory_gib <= data.budget_gib
        cls = "chosen" if i == data.chosen_index else ("" if fits else "over")
        mfu = getattr(p, "mfu", None)
        rows.append(
            f'<tr class="{cls}"><td>{i}</td><td class="l">{_marks(i, data)}</td>'
            f'<td class="l">{html.escape(p.plan.notation())}</td>'
            f"<td>{p.step_time_s:.3f}</td><td>{p.tokens_per_s_per_gpu:,.0f}</td>"
            f"<td>{'' if mfu is None else f'{mfu:.1%}'}</td><td>{p.peak_memory_gib:.1f}</td>"
            f"<td>{'yes' if fits else 'no'}</td></tr>")
    if yours_row is not None:
        rows.append(yours_row)
    return f'<table id="frontier-table">{head}{"".join(rows)}</table>'


def _mfu(p) -> str:
    mfu = getattr(p, "mfu", None)
    return "" if mfu is None else f"{mfu:.1%}"


def _attribution_table(att, theirs: str = "recommended") -> str:
    head = f"<tr><th class='l'>term</th><th>yours s</th><th>{html.escape(theirs)} s</th><th>delta s</th></tr>"
    body = [f"<tr><td class='l'>{html.escape(d.term)}</td><td>{d.yours_s:.3f}</td><td>{d.theirs_s:.3f}</td>"
            f"<td>{d.delta_s:+.3f}</td></tr>" for d in att.terms if d.yours_s or d.theirs_s]
    body.append(f"<tr class='chosen'><td class='l'>step</td><td>{sum(d.yours_s for d in att.terms):.3f}</td>"
                f"<td>{sum(d.theirs_s for d in att.terms):.3f}</td><td>{att.gap_s:+.3f}</td></tr>")
    body.append(f"<tr><td class='l'>peak memory (GiB)</td><td>{att.yours_memory_gib:.1f}</td>"
                f"<td>{att.theirs_memory_gib:.1f}</td>"
                f"<td>{att.theirs_memory_gib - att.yours_memory_gib:+.1f}</td></tr>")
    return f'<table id="attribution-table">{head}{"".join(body)}</table>'


def _marks(i: int, data: ReportInput) -> str:
    marks = []
    if i == data.recommended_index:
        marks.append("&#9733; recommended")
    if i == data.chosen_index:
        marks.append("charted below")
    return ", ".join(marks)


def _stage_table(est: "Estimate") -> str:
    rows = memory_rows_gib(est)
    head = ("<tr><th>rank</th><th>layers</th><th>recomputed</th><th>in-flight mb</th><th>ms / mb</th>"
            + "".join(f"<th>{name} GiB</th>" for name, _, _ in PARTS) + "<th>total GiB</th></tr>")
    body = []
    for s, r in zip(est.stages, rows):
        body.append(f"<tr><td>{s.rank}</td><td>{s.layers}</td><td>{s.recomputed_layers}</td>"
                    f"<td>{s.in_flight_microbatches:.1f}</td><td>{s.microbatch_time_s * 1e3:.1f}</td>"
                    + "".join(f"<td>{r[name]:.2f}</td>" for name, _, _ in PARTS)
                    + f"<td>{sum(r.values()):.2f}</td></tr>")
    return f'<table id="stage-table">{head}{"".join(body)}</table>'


def render_html(data: ReportInput) -> str:
    job, est = data.job, data.estimate
    m, c, t = job.model, job.cluster, job.training
    m_step = est.time.num_microbatches
    step = step_timeline(est) if m_step <= TIMELINE_MAX_MICROBATCHES else None
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{html.escape(data.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(data.title)}</h1>",
             _kv_table([
                 ("model", f"{m.name}: {m.num_params() / 1e9:.2f}B parameters, {m.num_layers} layers, "
                           f"hidden {m.hidden_size}, {m.num_heads} heads"),
                 ("cluster", f"{c.name}: {c.num_nodes} nodes x {c.gpus_per_node} {c.gpu.name} "
                             f"({c.num_gpus} GPUs, {c.gpu.memory_gib:.0f} GiB each)"),
                 ("training", f"sequence {t.seq_len}, global batch {t.global_batch} sequences, "
                              f"{t.precision.value}, {t.optimizer.value}"),
                 ("chosen plan", est.plan.notation()),
                 ("estimate", f"{est.step_time_s:.3f} s/step, {est.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
                              f"MFU {est.mfu:.1%}, peak {est.peak_memory_gib:.1f} GiB"
                              f"{'' if est.fits else ' (does not fit)'}"),
             ])]
    if data.comparison is not None:
        parts.append("<h2>Your plan against the frontier</h2>")
        parts.append(f'<p class="summary" id="comparison">{html.escape(data.comparison.summary())}</p>')
        if data.comparison.attribution is not None:
            parts.append("<p>Where the step time goes, term by term (the deltas add up to the gap):</p>")
            theirs = "recommended" if data.comparison.recommended is not None else "fastest that fits"
            parts.append(_attribution_table(data.comparison.attribution, theirs))
    if data.frontier:
        parts.append("<h2>Frontier: step time vs peak memory per GPU</h2>")
        if data.frontier_png:
            parts.append(_img(data.frontier_png, "frontier-plot", "frontier plot"))
        budget = "" if data.budget_gib is None else f" Memory budget {data.budget_gib:.1f} GiB per GPU."
        if data.chosen_index is not None:
            shown = " The plan charted below is highlighted."
        else:  # yours is charted: it is off the frontier's rows, marked with its own row
            shown = " Your plan (&#9670;, charted below) is listed where its step time falls."
        parts.append(f'<p class="muted">Pareto-optimal plans, fastest first; &#9733; marks the recommended '
                     f'plan.{shown}{html.escape(budget)}</p>')
        parts.append(_frontier_table(data))
    parts.append("<h2>Memory per GPU by pipeline rank (chosen plan)</h2>")
    parts.append(_img(memory_png(est), "memory-chart", "memory breakdown per pipeline rank"))
    parts.append(_stage_table(est))
    parts.append("<h2>One training step per pipeline rank (chosen plan)</h2>")
    if step is None:
        parts.append(f'<p class="muted" id="timeline-left-out">Not drawn: {m_step:,} micro-batches per step, '
                     f"more than the {TIMELINE_MAX_MICROBATCHES:,} the timeline draws (cost model: "
                     f"{est.step_time_s:.3f} s per step).</p>")
    else:
        parts.append(_img(timeline_png(step), "timeline-chart", "step timeline"))
        parts.append(f'<p class="muted">Simulated step {step.step_s:.3f} s (cost model: {est.step_time_s:.3f} s); '
                     f"bubble on rank 0: {step.timeline.bubble_s(0):.3f} s. Numbers on bars are micro-batch "
                     "indices. Per-stage forward/backward times come from the cost model's per-rank "
                     "times split by layers (backward = 2 x forward, plus recompute).</p>")
    for note in data.notes:
        parts.append(f'<p class="muted">{html.escape(note)}</p>')
    parts.append("</body></html>")
    return "\n".join(parts)
