"""`meshplan validate`: predicted against measured for a CSV of published training runs."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import JsonOpt, console, print_json, path_value
from meshplan.cli.main import app
from meshplan.data.published import DEFAULT_RUNS, PUBLISHED_RUNS, runs_csv
from meshplan.errors import MeshplanError
from meshplan.targets import Target


def _finite(obj):
    """NaN (no rows to take a median of) becomes null: strict JSON readers reject NaN."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


@app.command("validate")
def validate_cmd(
    runs: Annotated[str, typer.Option("--runs", help=f"A shipped set of published runs ({', '.join(PUBLISHED_RUNS)}) or a CSV of that format.")] = DEFAULT_RUNS,
    target: Annotated[Optional[Target], typer.Option("--target", help="Estimate every row with this stack's calibration (default: each row's framework's stack).")] = None,
    fit: Annotated[bool, typer.Option("--fit", help="Refit the calibration per (GPU generation, stack) on these runs first and print it.")] = False,
    write: Annotated[bool, typer.Option("--write-calibration", help="With --fit: write the fitted records to the calibration data file --out names (a new file: the shipped calibration with the refit records).")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=path_value, help="With --write-calibration: the file to write. An existing file, the shipped src/meshplan/spec/presets/calibration_fitted.json included, is replaced only with --force.")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --out: replace the refit records of an existing calibration data file.")] = False,
    holdout: Annotated[bool, typer.Option("--holdout", help="Also refit without each model family and each GPU generation and score the held-out rows (minutes).")] = False,
    loso: Annotated[bool, typer.Option("--leave-one-source-out", help="Refit without each source and score it.")] = False,
    fused_attention: Annotated[Optional[bool], typer.Option("--fused-attention/--no-fused-attention", help="Whether the runs used FlashAttention (default: each row's framework's: megatron-core yes, the 2020-22 Megatron runs no).")] = None,
    dropout: Annotated[Optional[bool], typer.Option("--dropout/--no-dropout", help="Whether the runs used dropout (default: each row's framework's: GPT-style runs did).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Fits (per GPU generation and stack) and held-out folds run at a time, in forked processes.")] = 1,
    as_published: Annotated[bool, typer.Option("--as-published", help="Validate the file as given: skip the documented corrections (data/corrections.csv) that match its rows.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Estimate every run of the CSV and compare throughput and memory with the measurements."""
    from meshplan.calib.validate import evaluate, load_corrected_runs

    if loso and not fit:
        raise MeshplanError("--leave-one-source-out scores a refit: give it with --fit")
    if write and not fit:
        raise MeshplanError("--write-calibration needs --fit")
    if write and out is None:
        raise MeshplanError("--write-calibration needs --out PATH: the calibration data file to write (the shipped "
                            "one is replaced only when --out names it and --force is given)")
    if (out is not None or force) and not write:
        raise MeshplanError(f"{'--out' if out is not None else '--force'} goes with --fit --write-calibration")
    if write:
        from meshplan.calib.records import check_target

        check_target(out, force=force)  # before the fit: minutes of work not lost to a bad path
    settings = {k: v for k, v in (("fused_attention", fused_attention), ("dropout", dropout)) if v is not None}
    rows, skipped, corrections = load_corrected_runs(runs_csv(runs), as_published=as_published)
    log = logging.getLogger(__name__)
    for c in corrections.applied:  # shown under --verbose
        log.info("corrected row %s: %s (%s)", c.row_id, c.change(), c.evidence)
    for c, why in corrections.not_applied:
        log.warning("correction of row %s not applied: %s (%s)", c.row_id, c.change(), why)
    if target is not None:
        rows = [replace(r, stack=target.value) for r in rows]
    fitted: dict[str, dict] = {}
    held: dict[str, dict] = {}
    calib_for = None
    if fit:
        from meshplan.calib.fit import fit_all, fitted_calibration

        fits = fit_all(rows, settings, workers=workers)
        fitted = {k: res.__dict__ for k, res in fits.items()}
        if write:
            from meshplan.calib.records import write_records

            path = write_records(fits, runs, out)
            log.info("wrote %s to %s", ", ".join(fits), path)

        def calib_for(run):  # noqa: F811 - the fitted calibration of the run's (generation, stack)
            return fitted_calibration(run, fits)
    if holdout or loso:
        from meshplan.calib.holdout import leave_one_out

        for by in (("family", "generation") if holdout else ()) + (("source",) if loso else ()):
            # folds start from the fit just made, else from the shipped records (calib/holdout.py)
            held[by] = leave_one_out(rows, by, settings, full=fits if fit else None, workers=workers).summary()

    report = evaluate(rows, skipped, settings=settings, calib_for=calib_for)
    from meshplan.calib.pairwise import MEASURED_TIE, pairs, summarize
    from meshplan.calib.release_twins import disagreements, mark_rows

    found = pairs(rows, report.rows)
    twins = disagreements(rows, report)
    report = mark_rows(report, twins)  # marks only: every row stays in the figures
    if json_out:
        out = report.to_dict()
        out["pairwise"] = {**summarize(found), "pairs": [p.to_dict() for p in found]}
        out["release_twins"] = [d.to_dict() for d in twins]
        out["corrections"] = corrections.to_dict()
        if fit:
            out["fit"] = fitted
        if held:
            out["leave_one_out"] = held
        print_json(_finite(out))
        return
    con = console()
    if corrections.applied:
        con.print(f"applied {len(corrections.applied)} documented corrections from meshplan/data/corrections.csv "
                  "(--verbose lists them); --as-published to validate the file as given")
    t = Table(title=f"Predicted vs measured: {runs}")
    for col in ("id", "model", "gpu", "plan", "metric", "measured", "predicted", "error",
                "mem GiB", "pred GiB", "mem err", "fits"):
        t.add_column(col, justify="left" if col in ("model", "gpu", "plan", "metric") else "right")
    for r in report.rows:
        fits = "yes" if r.fits else "no"
        if r.oom:
            fits += " (OOM)" if not r.fits else " [red](OOM missed)[/red]"
        t.add_row(r.row_id, r.model, r.gpu, r.plan, r.metric or "", _fmt(r.measured, ".4g"),
                  _fmt(r.predicted, ".4g"), _fmt(r.error, "+.1%"), _fmt(r.measured_memory_gib, ".1f"),
                  _fmt(r.predicted_memory_gib, ".1f"), _fmt(r.memory_error, "+.1%"), fits)
    con.print(t)
    if report.skipped:
        sk = Table(title="Rows not estimated")
        sk.add_column("id", justify="right")
        sk.add_column("source")
        sk.add_column("reason")
        for s in report.skipped:
            sk.add_row(s.row_id, s.source, s.reason)
        con.print(sk)
    s = report.summary()
    summ = Table(title="Summary (absolute relative error)")
    summ.add_column("quantity")
    summ.add_column("rows", justify="right")
    summ.add_column("median", justify="right")
    summ.add_column("p90", justify="right")
    summ.add_row("throughput", str(s["throughput_rows"]), _fmt(s["throughput_median_abs_error"], ".1%"),
                 _fmt(s["throughput_p90_abs_error"], ".1%"))
    summ.add_row("peak memory", str(s["memory_rows"]), _fmt(s["memory_median_abs_error"], ".1%"),
                 _fmt(s["memory_p90_abs_error"], ".1%"))
    con.print(summ)
    con.print(f"OOM rows predicted not to fit: {s['oom_predicted_not_fitting']} of {s['oom_rows']}; "
              f"{s['rows']} rows estimated, {s['skipped']} not estimated.")
    if s["preset_rows"]:
        con.print(f"{s['preset_rows']} rows took memory settings (FSDP, recompute, activation offload) from the "
                  "Megatron-Bridge preset they ran (data/bridge_recipes.csv; `--json` rows: preset, assumed).")
    by = report.breakdown()
    bias = Table(title="Median signed throughput error (predicted / measured - 1) by group")
    for col in ("by", "group", "rows", "median signed", "median |error|"):
        bias.add_column(col, justify="right" if col in ("rows", "median signed", "median |error|") else "left")
    for name in ("precision", "dense_moe", "generation", "gpu"):
        for g, v in by[name].items():
            bias.add_row(name, g, str(v["rows"]), _fmt(v["median_signed_error"], "+.1%"),
                         _fmt(v["median_abs_error"], ".1%"))
    con.print(bias)
    _print_pairwise(con, summarize(found), MEASURED_TIE)
    _print_twins(con, report)
    for key, res in fitted.items():
        con.print(f"fit {key}: {res['values']} (throughput median error {res['throughput_error_before']:.1%}"
                  f" -> {res['throughput_error_after']:.1%} on {res['throughput_rows']} rows; memory "
                  f"{_fmt(res['memory_error_before'], '.1%')} -> {_fmt(res['memory_error_after'], '.1%')} "
                  f"on {res['memory_rows']} rows)")
    for name, h in held.items():
        con.print(f"leave one {name} out: {h['rows']} held-out rows, median |error| "
                  f"{_fmt(h['median_abs_error'], '.1%')}, p90 {_fmt(h['p90_abs_error'], '.1%')}, median signed "
                  f"{_fmt(h['median_signed_error'], '+.1%')}; " + ", ".join(
                      f"{g}: {_fmt(v['median_abs_error'], '.1%')} ({v['rows']})" for g, v in h["groups"].items())
                  + f"; median over {name}s {_fmt(h['median_of_group_medians'], '.1%')} ({h['how']})")


def _print_pairwise(con, summary: dict, tie: float) -> None:
    """The error of the model's ratio between two measured layouts of one job (calib/pairwise.py)."""
    if not summary["all"]["pairs"]:
        con.print("No job of these runs is measured in two layouts on one release: no pairwise ratio error.")
        return
    t = Table(title="Ratio between two measured layouts of one job: |log(model ratio / measured ratio)|")
    for col in ("knob the layouts differ in", "pairs", "median", "p90", "misordered", "alone: pairs", "median", "misordered"):
        t.add_column(col, justify="left" if col.startswith("knob") else "right")
    pct = lambda v: _fmt(None if v is None else math.expm1(v), ".1%")  # noqa: E731 - a log error as a ratio
    rows = [("all", summary["all"], None)] + [(k, v, summary["by_knob_alone"][k]) for k, v in summary["by_knob"].items()
                                             if v["pairs"]]
    for name, v, alone in rows:
        t.add_row(name, str(v["pairs"]), pct(v["median_abs_log_error"]), pct(v["p90_abs_log_error"]), str(v["misordered"]),
                  "" if alone is None else str(alone["pairs"]),
                  "" if alone is None else pct(alone["median_abs_log_error"]),
                  "" if alone is None else str(alone["misordered"]))
    con.print(t)
    con.print("Pairs: two rows of one job (model, GPUs, sequence, batch, precision, stack, release) in different layouts; "
              f"'alone': the pair differs in that knob only; misordered: measured more than {tie:.0%} apart and the model "
              "orders them the other way round. The robust recommendation holds two plans to this error "
              "(meshplan.search.robust, via bench/model_error.py).")


def _print_twins(con, report) -> None:
    """Rows a twin in another release contradicts (calib/release_twins.py), kept in the figures."""
    marked = [r for r in report.rows if r.flags]
    if not marked:
        return
    t = Table(title="Rows a twin in another release contradicts (same job and plan, estimated alike, measured "
                    "far apart): kept in the figures above")
    for col in ("id", "source", "model", "gpu", "error", "mark"):
        t.add_column(col, justify="right" if col in ("id", "error") else "left")
    for r in marked:
        t.add_row(r.row_id, r.source, r.model, r.gpu, _fmt(r.error, "+.1%"), "; ".join(r.flags))
    con.print(t)
