"""The robust recommendation's band against the published plan, for docs/experts.md (issue 15
items 3 and 5): is the recommended plan ever estimated slower than the published one by more than
the error the data measures on the model's ratio between two layouts? Rows are
``experts_compare.Row``."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experts_compare import Row

NO_PAIRS = " (no pairs)"
"""The suffix bench_experts puts on a knob no pair of measured layouts measures."""


def beyond_band(r: Row) -> bool:
    """The published plan is estimated faster than the recommended one by more than the band."""
    return r.ratio is not None and r.band is not None and r.ratio * (1 + r.band) < 1 - 1e-9


def band_section(rows: list[Row]) -> list[str]:
    rated = [r for r in rows if r.ratio is not None and r.band is not None]
    if not rated:
        return []
    out = ["", "## The recommendation's band against the published plan", "",
           "The recommendation holds two plans of one job to the error of the model's RATIO between them "
           "(`meshplan validate`'s pairwise table: median |log(model ratio / measured ratio)| over pairs of measured "
           "layouts of one job, per knob the layouts differ in; `src/meshplan/data/model_error.json` 'pairwise', "
           "written by `bench/model_error.py`): the median error of the measured pairs that differ in nothing but knobs "
           "in which the two plans differ, and the absolute error of one step where no such pair covers a knob. Here, that band between the recommended and the "
           "published plan: a published plan estimated faster than the recommendation but within the band is a tie "
           "by the data; beyond it the recommendation gave up speed the model's measured error does not cover.", "",
           "| set | rows | published faster (ratio < 1) | of which within the band | beyond the band "
           "| of which the nominally fastest plan that fits is slower than the published one too | band (median) "
           "| rows whose band is the absolute error (a knob no pair measures) |",
           "|---|---:|---:|---:|---:|---:|---|---:|"]
    for csv in sorted({r.csv for r in rated}) + ["all"]:
        sub = [r for r in rated if csv in ("all", r.csv)]
        slower = [r for r in sub if r.ratio < 1 - 1e-9]
        beyond = [r for r in sub if beyond_band(r)]
        search_short = sum(r.nominal_ratio is not None and r.nominal_ratio < 1 - 1e-9 for r in beyond)
        out.append(f"| {csv} | {len(sub)} | {len(slower)} | {len(slower) - len(beyond)} | {len(beyond)} | {search_short} | "
                   f"{statistics.median(r.band for r in sub):.1%} | {sum(NO_PAIRS in r.band_knobs for r in sub)} |")
    missing = Counter(k.removesuffix(NO_PAIRS) for r in rated for k in r.band_knobs.split(", ") if k.endswith(NO_PAIRS))
    if missing:
        out += ["", "Knobs the recommendation and the published plan differ in that no pair of measured layouts "
                "measures (rows): " + ", ".join(f"{k} {n}" for k, n in missing.most_common()) + "."]
    beyond = sorted((r for r in rated if beyond_band(r)), key=lambda r: r.ratio)
    if beyond:
        out += ["", f"Published plans estimated faster than the recommendation by more than the band ({len(beyond)}; "
                "'nominal ratio' below 1: the search finds no plan as fast as the published one, whatever the band):", "",
                "| set | row | model | GPUs | published | recommended | ratio | nominal ratio | band | knobs |",
                "|---|---|---|---:|---|---|---:|---:|---:|---|"]
        out += [f"| {r.csv} | {r.row_id} | {r.model} | {r.gpus} x {r.gpu} | `{r.published}` | `{r.recommended}` | "
                f"{r.ratio:.2f} | {r.nominal_ratio:.2f} | {r.band:.1%} | {r.band_knobs} |" for r in beyond]
        out += counted_offload_note(beyond)
    return out


COUNTED_OFFLOAD = "offload=activations:"
"""How a plan that offloads the activations of a count of layers writes it."""


def counted_offload_note(beyond: list[Row]) -> list[str]:
    """Why the search does not reach published plans that offload a count of layers' activations:
    the megatron targets leave it out of the searched space (export.common's
    MEGATRON_COUNTED_ACTIVATION_OFFLOAD), with the measured figure that decided it."""
    from meshplan.export.common import MEGATRON_COUNTED_ACTIVATION_OFFLOAD

    counted = [r for r in beyond if COUNTED_OFFLOAD in r.published and COUNTED_OFFLOAD not in (r.recommended or "")]
    if MEGATRON_COUNTED_ACTIVATION_OFFLOAD or not counted:
        return []
    off, other = offload_signed_errors()
    return ["", f"Of these, {len(counted)} (rows {', '.join(r.row_id for r in counted)}) offload the activations of a "
            "count of layers (Megatron's `--cpu-offloading-num-layers`), which the megatron search leaves out of its "
            "space (`export.common.MEGATRON_COUNTED_ACTIVATION_OFFLOAD`; issue 15, no gain from a term the data shows "
            f"wrong): the {len(off)} measured Megatron-Bridge rows that offload activations are estimated "
            f"{statistics.median(off):+.1%} off their measured throughput (median signed error, `meshplan validate "
            f"--runs megatron-bridge`) against {statistics.median(other):+.1%} for the {len(other)} other dense rows "
            "of the same GPUs, a gap that pricing the copies at the node's shared host DRAM and Transformer Engine's "
            "offload schedule (cost/offload.py) does not close. With it on, the search reaches these plans "
            "(docs/search.md, 'Session 13: offload13')."]


def offload_signed_errors() -> tuple[list[float], list[float]]:
    """Signed throughput errors of the Megatron-Bridge rows that offload a count of layers'
    activations, and of the other dense rows on the same GPUs."""
    from meshplan.calib.validate import evaluate, load_corrected_runs
    from meshplan.data.published import runs_csv

    runs, skipped, _ = load_corrected_runs(runs_csv("megatron-bridge"))
    rows = [r for r in evaluate(runs, skipped).rows if r.error is not None]
    off = [r for r in rows if COUNTED_OFFLOAD in r.plan]
    gpus = {r.gpu for r in off}
    other = [r.error for r in rows if r.gpu in gpus and not r.moe and COUNTED_OFFLOAD not in r.plan]
    return [r.error for r in off], other
