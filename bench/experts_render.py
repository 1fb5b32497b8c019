"""docs/experts.md from the rows of bench/bench_experts.py: the distribution of ratios, where the
large gains come from, their verdicts and bands, and the sections on recompute, memory and plans
outside the search space."""

from __future__ import annotations

import statistics
from dataclasses import replace

from meshplan.calib.validate import Run, load_runs
from meshplan.cost import estimate
from meshplan.data.published import PUBLISHED_RUNS, runs_csv
from meshplan.plan import Recompute

from experts_band import band_section  # bench/ is the script's directory, on sys.path
from experts_compare import STACK, Row  # bench/ is the script's directory, on sys.path
from experts_evidence import (  # bench/ is the script's directory, on sys.path
    LARGE_GAIN,
    _runs_by_id,
    contradicted,
    measured_ratio,
    measured_sibling,
    measured_sibling_ratio,
    measured_step_s,
    run_calibration,
    verdict_section,
)

def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    q = lambda f: xs[min(len(xs) - 1, int(f * (len(xs) - 1) + 0.5))]
    return f"median {statistics.median(xs):.2f}, p10 {q(0.1):.2f}, p90 {q(0.9):.2f}, max {xs[-1]:.2f}"


def recompute_pairs() -> list[tuple[str, str, str, float, float, float, float]]:
    """Published pairs of one job run with full recompute and with selective recompute plus
    sequence parallel (same model, GPUs, batch, tp, pp, vpp, micro-batch; Korthikanti et al.
    2022 Table 5): (ids, model, job, measured full/selective step ratio, the model's, the model's
    saving on forward+backward math from sequence parallel, its full-recompute time over the rest
    of the full-recompute step)."""
    out = []
    for csv in PUBLISHED_RUNS:
        runs, _ = load_runs(runs_csv(csv))
        groups: dict[tuple, dict[str, Run]] = {}
        for r in runs:
            d = r.plan.dims
            key = (r.model.name, r.cluster.num_gpus, r.training.seq_len, r.training.global_batch,
                   d.tp, d.pp, d.dp, r.plan.vpp, r.plan.micro_batch)
            groups.setdefault(key, {}).setdefault(r.plan.recompute.value, r)
        for key, g in groups.items():
            if "full" not in g or "selective" not in g:
                continue
            steps = []
            for r in (g["full"], g["selective"]):
                est = estimate(r.model, r.cluster, r.training, r.plan, run_calibration(r))
                steps.append((est.step_time_s, measured_step_s(r, est.step_time_s), est.time.terms_s()))
            (ef, mf, tf), (es, ms, ts) = steps
            if mf is None or ms is None:
                continue
            out.append((f"{g['full'].row_id}/{g['selective'].row_id}", key[0],
                        f"{key[1]} GPUs, tp{key[4]} pp{key[5]}", mf / ms, ef / es,
                        1 - ts["compute"] / tf["compute"], tf["recompute"] / (ef - tf["recompute"])))
    return out


def peak_without_recompute_gib(row: Row) -> float:
    """Peak memory of the row's published layout with no recompute (the stack's other features
    unchanged): what the published run would have needed had it not recomputed."""
    run = _runs_by_id(row.csv)[row.row_id]
    plan = replace(run.plan, recompute=Recompute.NONE, recompute_layers=(), recompute_modules=())
    return estimate(run.model, run.cluster, run.training, plan, run_calibration(run)).peak_memory_gib


def _recompute_section(big: list[Row]) -> list[str]:
    by_rc = [r for r in big if min(r.term_deltas.items(), key=lambda kv: kv[1])[0] == "recompute"]
    old = [r for r in by_rc if r.old_stack]
    needed = sorted(peak_without_recompute_gib(r) / r.budget_gib for r in old)
    forced = [x for x in needed if x > 1]
    csvs = sorted({r.csv for r in by_rc})
    heads = sorted((r.budget_gib - r.recommended_gib) / r.budget_gib for r in by_rc if r.recommended_gib)
    mb_rc = sum(r.plan.recompute != Recompute.NONE for r in _runs_by_id("megatron-bridge").values())
    out = ["", "## Gains from dropping recompute", "",
           f"{len(by_rc)} of the {len(big)} large gains have recompute as their largest term; they all come from "
           f"the {', '.join(csvs) or '-'} set; {len(old)} of them are runs of a stack older than Megatron-LM v3.0 "
           "(full recompute, no sequence parallel, unfused attention: Megatron-LM 2020-22 and BigScience's "
           "Megatron-DeepSpeed), which had neither selective recompute nor sequence parallel, the two features "
           "the recommended plans use instead. On that stack the published layout without recompute would "
           f"need more memory than the budget in {len(forced)} of those {len(old)} runs"
           + (f" ({forced[0]:.2f}x to {forced[-1]:.2f}x the budget)" if forced else "")
           + ": full recompute was what made the layout fit, not a conservative choice. The recommended plans keep "
           + (f"{heads[0]:.1%} to {heads[-1]:.1%} (median {statistics.median(heads):.1%}) of the memory budget free"
              if heads else "-")
           + " at the model's peak, i.e. at least the p90 memory error of `validate` on top of it "
           "(`meshplan.search.robust`). The Megatron-Bridge tables leave the recompute column blank; "
           f"{mb_rc} of their published plans recompute as their preset does (`data/bridge_recipes.csv`), and "
           f"{sum(r.csv == 'megatron-bridge' for r in by_rc)} of their large gains have recompute as the largest term.", "",
           "Is recompute charged as Megatron runs it? The same authors published the same jobs run both ways "
           "(full recompute without sequence parallel, and selective recompute with sequence parallel). "
           "Measured and modelled step-time ratios:", "",
           "| rows | model | job | measured full / selective | model full / selective | model overstates by "
           "| model: SP saving on the math | model: full recompute over the rest of the step |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for ids, model, job, meas, mod, sp_saving, rc_share in recompute_pairs():
        out.append(f"| {ids} | {model} | {job} | {meas:.3f} | {mod:.3f} | {mod / meas - 1:+.1%} | "
                   f"{sp_saving:.1%} | {rc_share:.1%} |")
    out += ["", "So these gains are real in kind and in most of their size (Korthikanti et al. 2022 measured "
            "29-32% on these very jobs), and the model overstates them by the 'overstates' column. The recompute "
            "charge itself is Megatron's (full recompute runs the forward again with its TP collectives: that paper's "
            "Table 4 measures +39% per layer for the 22B job, 27.2 ms against 19.6 ms), and so is sequence "
            "parallel's saving per layer (norms, dropout and residuals on 1/t of the tokens, less the backward's "
            "all-gather of each column-parallel linear's input shard, Sec. 4.2.2: 3% per layer, 19.6 ms to "
            "19.0 ms; cost/tp_backward.py, tests/planner/test_recompute_published.py). The excess left is the "
            "forward being slower than measured on these jobs, its rerun under full recompute included (the "
            "Ampere Megatron fit is shared with BLOOM's Megatron-DeepSpeed runs, whose tensor-parallel layers "
            "ran slower). "
            "A ratio above 1.15 on these rows means: the published run predates the features, "
            "not that the expert chose badly for their stack."]
    return out


PRESET_NOTE = "Megatron-Bridge preset"
"""How ``calib/recipe_overlay.py`` marks a row's ``assumed`` lines that come from its preset."""


def without_preset_settings(run: Run):
    """The published plan with what the row took from its Megatron-Bridge preset taken out again
    (activation offload, and recompute when it came from the preset): as the rows were estimated
    before ``calib/recipes.py``. The ZeRO stage stays (the rows that took FSDP from the preset
    give no other)."""
    from_preset = any(a.startswith("recompute: ") and PRESET_NOTE in a and "kept" not in a for a in run.assumed)
    plan = replace(run.plan, offload=(), offload_layers=0)
    if from_preset:
        plan = replace(plan, recompute=Recompute.NONE, recompute_layers=(), recompute_modules=())
    return plan


def _over_budget_section(rows: list[Row]) -> list[str]:
    """The published Megatron-Bridge plans the model puts over the budget, and what their presets
    (data/bridge_recipes.csv) did about memory."""
    bridge = [r for r in rows if r.csv == "megatron-bridge"]
    if not bridge:
        return []
    runs = _runs_by_id("megatron-bridge")
    over = [r for r in bridge if not r.published_fits]

    def fits_without(r: Row) -> bool:
        run = runs[r.row_id]
        est = estimate(run.model, run.cluster, run.training, without_preset_settings(run),
                       run_calibration(run))
        return est.peak_memory_gib <= r.budget_gib

    took = [r for r in bridge if runs[r.row_id].preset]
    before = [r for r in bridge if (not r.published_fits) if not runs[r.row_id].preset] + [
        r for r in took if not fits_without(r)]
    now_fit = [r for r in took if r.published_fits and not fits_without(r)]
    modular = [r for r in took if runs[r.row_id].plan.recompute_modules]
    took_still_over = [r for r in over if runs[r.row_id].preset]
    no_preset = [r for r in over if r not in took_still_over]
    fams: dict[str, int] = {}
    for r in over:
        fams[r.model] = fams.get(r.model, 0) + 1
    ex = took_still_over[0] if took_still_over else None
    return ["", "## Published plans the model puts over the memory budget", "",
            f"The performance tables leave out the memory settings of the Megatron-Bridge presets behind them "
            "(`scripts/performance/configs/<family>/*_workload_base_configs.py`): Megatron FSDP, activation offload "
            "(`cpu_offloading_num_layers`), full recompute of the first layers of each stage "
            "(`recompute_num_layers`) and selective recompute of named modules (`recompute_modules`). "
            "`data/bridge_recipes.csv` records them per preset, keyed by model, GPU, precision, GPU count, batch "
            "and layout, with the preset file and the commit they were read from; a row whose key matches takes "
            "what meshplan can express where its own column is blank (`calib/recipes.py`, listed in the row's "
            "`assumed`). Without them the model puts "
            f"{len(before)} published Megatron-Bridge plans over the budget; with them {len(over)} "
            "(" + ", ".join(f"{m} {n}" for m, n in sorted(fams.items(), key=lambda kv: -kv[1])) + ").", "",
            f"- {len(took)} rows took settings from their preset; {len(now_fit)} of them fit now: "
            + (", ".join(f"{r.row_id} ({r.model}, {r.gpus} x {r.gpu}, `{r.published}`)" for r in now_fit) or "none")
            + ".",
            f"- {len(took_still_over)} took all of them and are still over"
            + (f" (e.g. row {ex.row_id}, {ex.model} on {ex.gpu}: `{ex.published}`): in the model the activations of "
               "the layers the preset leaves on the GPU still exceed the budget" if ex else "") + ".",
            f"- {len(modular)} of the rows that took settings recompute named modules (`mla_up_proj`, `moe_act`, "
            "`layernorm`, `moe`, `mlp`: DeepSeek-V3, Kimi-K2, GPT-OSS and Nemotron 3 presets), each costed by the "
            "activations it drops and the forward it reruns (`cost/recompute_modules.py`); "
            f"{sum(not r.published_fits for r in modular)} of them are still over.",
            f"- {len(no_preset)} match no preset of the recorded commits that sets memory options: either their "
            "container ran another version of the preset (the tables span containers 25.09 to 26.08; the presets "
            "change between them), or the preset sets none and the model over-counts memory (MoE dispatch "
            "buffers, fp8 weight copies, allocator reserve): not separated.", "",
            "On the jobs whose published plan is still over the budget the search holds its plans to a stricter "
            "memory limit than the experts had: a plan it rejects there may well have fit."]


def render(rows: list[Row], skipped, stats: dict, sample: int | None,
           sets: tuple[str, ...] = tuple(PUBLISHED_RUNS)) -> str:
    out = ["# Recommended plans against the published ones", "",
           "Generated by `PYTHONPATH=src python bench/bench_experts.py` (do not edit by hand)"
           + (f"; SAMPLE of every k-th row (--sample {sample})" if sample else "")
           + ("" if set(sets) == set(PUBLISHED_RUNS) else f"; only {', '.join(sets)}") + ".", "",
           "For each published run of `meshplan validate --runs calibration` and `--runs megatron-bridge`, the "
           f"search's recommended plan (robust to the model's error, `meshplan.search.robust`, as `meshplan plan` recommends it) for the same job on the {STACK.value} stack, both estimated by the cost model "
           "with the calibration `validate` uses. ratio = published step time / recommended step time: above 1 "
           "the model claims the search's plan is faster. The model's own throughput error "
           "(`meshplan validate`) bounds how much of a ratio is real.", ""]
    ratios = [r.ratio for r in rows if r.ratio is not None]
    out += ["## Distribution", "", "| set | rows | ratio | nominal ratio (fastest that fits) | > 1.15 | < 1 (published faster) "
            "| outside the space | published over the budget (model) |",
            "|---|---:|---|---|---:|---:|---:|---:|"]
    for csv in sets:
        sub = [r for r in rows if r.csv == csv]
        rs = [r.ratio for r in sub if r.ratio is not None]
        nom = [r.nominal_ratio for r in sub if r.nominal_ratio is not None]
        out.append(f"| {csv} | {len(sub)} | {_quantiles(rs)} | {_quantiles(nom)} | {sum(x > LARGE_GAIN for x in rs)} | "
                   f"{sum(x < 1 - 1e-9 for x in rs)} | {sum(r.outside is not None for r in sub)} | "
                   f"{sum(not r.published_fits for r in sub)} |")
    noms = [r.nominal_ratio for r in rows if r.nominal_ratio is not None]
    out.append(f"| all | {len(rows)} | {_quantiles(ratios)} | {_quantiles(noms)} | {sum(x > LARGE_GAIN for x in ratios)} | "
               f"{sum(x < 1 - 1e-9 for x in ratios)} | {sum(r.outside is not None for r in rows)} | "
               f"{sum(not r.published_fits for r in rows)} |")
    big = sorted((r for r in rows if r.ratio is not None and r.ratio > LARGE_GAIN), key=lambda r: -r.ratio)
    tally: dict[str, float] = {}
    for r in big:
        for term, d in r.term_deltas.items():
            if d < 0:
                tally[term] = tally.get(term, 0.0) - d
    out += ["", f"Where the {len(big)} large gains come from (sum over those rows of the saving per term, "
            "as a share of the published step):", "", "| term | summed saving (x published step) | rows where it is the largest |",
            "|---|---:|---:|"]
    firsts: dict[str, int] = {}
    for r in big:
        top = min(r.term_deltas.items(), key=lambda kv: kv[1])[0]
        firsts[top] = firsts.get(top, 0) + 1
    for term, s in sorted(tally.items(), key=lambda kv: -kv[1]):
        out.append(f"| {term} | {s:.2f} | {firsts.get(term, 0)} |")
    out += band_section(rows)
    out += verdict_section(big)
    out += ["", f"## Ratios above {LARGE_GAIN}", "",
            "The last column: where the data holds another measured run of the same job with another layout, this "
            "run's measured step over the fastest such run (a gain the measurements themselves show).", "",
            "| set | row | model | GPUs | seq x batch | published | recommended | GiB / budget | ratio "
            "| ratio against the published run's measured step | largest savings "
            "| measured: this / fastest other layout of the same job (model's ratio) |",
            "|---|---|---|---:|---|---|---|---:|---:|---:|---|---|"]
    for r in big:
        out.append(f"| {r.csv} | {r.row_id} | {r.model} | {r.gpus} x {r.gpu} | {r.seq} x {r.batch} | "
                   f"`{r.published}`{'' if r.published_fits else ' (over budget)'} | `{r.recommended}` | "
                   f"{r.recommended_gib:.1f} / {r.budget_gib:.1f} | "
                   f"{r.ratio:.2f} | {_fmt(measured_ratio(r))} | {r.terms} | {measured_sibling_ratio(r)} |")
    shown = [(r, sib) for r in big if (sib := measured_sibling(r)) is not None]
    against = [(r, sib) for r, sib in shown if contradicted(sib)]
    out += ["", f"{len(shown)} of the {len(big)} large gains have another measured run of the same job in the data. "
            f"In {len(against)} of them the model ranks the two measured layouts the other way round from the "
            f"measurements, by more than {LARGE_GAIN - 1:.0%}: a term of the model is wrong for that job, and the "
            "row's ratio is not to be trusted: "
            + (", ".join(f"{r.csv} {r.row_id} ({r.model}, ratio {r.ratio:.2f}; against row {sib.row_id}: measured "
                         f"{sib.measured:.2f}, model {sib.model:.2f})" for r, sib in against) or "none") + "."]

    out += _recompute_section(big)
    out += _over_budget_section(rows)
    outside = [r for r in rows if r.outside is not None]
    out += ["", "## Published plans outside the search space", "",
            "The search cannot propose these layouts (the rule of `search/space.py` each one breaks).", ""]
    reasons: dict[str, list[Row]] = {}
    for r in outside:
        reasons.setdefault(r.outside, []).append(r)
    out += [f"- {len(rs)} x {why}: " + ", ".join(f"{r.csv} {r.row_id} ({r.model})" for r in rs)
            for why, rs in sorted(reasons.items(), key=lambda kv: -len(kv[1]))]
    out += ["", "| set | row | published | why |", "|---|---|---|---|"]
    out += [f"| {r.csv} | {r.row_id} | `{r.published}` | {r.outside} |" for r in outside] or ["| - | - | - | none |"]
    nothing = [r for r in rows if r.ratio is None]
    if nothing or skipped:
        out += ["", "## Not compared", "", "| set | row | why |", "|---|---|---|"]
        out += [f"| {r.csv} | {r.row_id} | {r.terms} |" for r in nothing]
        out += [f"| {c} | {i} | {why} |" for c, i, why in skipped]
    if stats.get("stale"):
        out += ["", "Rendered with `--render-only` from searches cached on an earlier state of the planner's source "
                "(a plain run re-runs them)."]
    out += ["", f"Run time: {stats['wall_s']:.0f} s wall, {stats['cpu_s']:.0f} s CPU in searches, {stats['workers']} "
            f"worker(s); {len(rows)} rows in {stats['jobs']} distinct jobs (one search per job), "
            + ("in the run that filled the cache (this page re-rendered from it with `--render-only`)."
               if stats.get("cached") else f"{stats['searched']} searched this time (the rest cached).")]
    return "\n".join(out) + "\n"
