"""What `meshplan plan` prints: the frontier table per GPU count, the scaling table, the JSON
rows, and the one line when nothing fits (cli/plan_cmd.py runs the searches)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from meshplan.cli.plan_flags import plan_argv
from meshplan.plan import Recompute
from meshplan.spec.cluster import GIB, ClusterSpec
from meshplan.spec.training import TrainingSpec
from meshplan.targets import Target

OVER_BUDGET_ROWS = 3
"""Frontier rows shown above the recommended plan (faster, but over the budget)."""


def _nothing_fits(results, model_name: str, memory_gib: float | None) -> str:
    leanest = min((p for r in results for p in r.frontier), key=lambda p: p.peak_memory_bytes, default=None)
    budget_gib = results[0].budget_bytes / GIB
    where = (f"--memory-gib {memory_gib:g}" if memory_gib is not None else "the GPU's memory")
    if leanest is None:
        return f"no plan for {model_name} at all on {results[0].num_gpus} GPUs"
    helps = ["more GPUs (more pipeline/tensor/sharding ways)"]
    if leanest.plan.micro_batch > 1:
        helps.append("a smaller micro-batch")
    helps.append("a shorter sequence or a smaller global batch")
    if leanest.plan.recompute != Recompute.FULL:
        helps.append("full recompute")
    return (f"no plan fits {budget_gib:.1f} GiB per GPU ({where}, with the CUDA context and NCCL buffers); "
            "the leanest plan needs "
            f"{leanest.peak_memory_gib:.1f} GiB ({leanest.plan.notation()} on {leanest.num_gpus} GPUs). "
            f"What would help: {', '.join(helps)}")


def _row(p, training: TrainingSpec, budget_bytes: float) -> dict[str, Any]:
    return {
        "plan": p.plan.notation(), "flags": plan_argv(p.plan), "step_time_s": p.step_time_s,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "mfu": p.mfu,
        "peak_memory_gib": p.peak_memory_gib, "fit_memory_gib": p.fit_memory_gib,
        "fits": p.peak_memory_bytes <= budget_bytes,
        "gpu_hours_per_billion_tokens": p.gpu_hours_per_billion_tokens(training),
        "plan_detail": p.plan.to_dict(),
    }


def _to_json(results, choices, margins, training, written, plot) -> dict[str, Any]:
    per = []
    for r, choice, margin in zip(results, choices, margins):
        per.append({
            "num_gpus": r.num_gpus, "budget_gib": r.budget_bytes / GIB,
            "recommended": None if choice is None else choice.index,
            "fastest_that_fits": r.recommended_index,
            "robust": None if choice is None else choice.to_dict(),
            "recommended_memory": None if margin is None else margin.to_dict(),
            "frontier": [_row(p, training, r.budget_bytes) for p in r.frontier],
            "search": {"global_configs": r.global_configs, "refined_configs": r.refined_configs,
                       "plans_evaluated": r.plans_evaluated, "elapsed_s": r.elapsed_s},
        })
    out: dict[str, Any] = per[0] if len(per) == 1 else {"counts": per, "scaling": _scaling_rows(results, training)}
    out = dict(out)
    out["out"] = written
    out["plot"] = plot
    return out


def _scaling_rows(results, training) -> list[dict[str, Any]]:
    from meshplan.search.planner import scaling_frontier

    on_front = {r.num_gpus for r in scaling_frontier(results)}
    rows = []
    for r in results:
        rec = r.recommended
        rows.append({
            "num_gpus": r.num_gpus, "on_frontier": r.num_gpus in on_front,
            "plan": rec.plan.notation() if rec else None,
            "step_time_s": rec.step_time_s if rec else None,
            "tokens_per_s_per_gpu": rec.tokens_per_s_per_gpu if rec else None,
            "mfu": rec.mfu if rec else None,
            "gpu_hours_per_billion_tokens": rec.gpu_hours_per_billion_tokens(training) if rec else None,
        })
    return rows


def _print_frontier(con, res, cl: ClusterSpec, training: TrainingSpec, top: int, choice, target: Target) -> None:
    rec = None if choice is None else choice.index
    title = (f"Pareto frontier: {res.num_gpus} x {cl.gpu.name}, budget {res.budget_bytes / GIB:.1f} GiB/GPU "
             f"({len(res.frontier)} plans; {res.plans_evaluated:,} evaluated in {res.elapsed_s:.2f} s)")
    t = Table(title=title)
    for col in ("#", "", "step s", "tok/s/GPU", "MFU", "GiB to fit", "plan"):
        t.add_column(col, justify="left" if col in ("", "plan") else "right")
    rows = list(enumerate(res.frontier))
    if top and len(rows) > top:
        # Around the budget: a few faster plans that do not fit, then the fitting ones.
        first = max(0, (rec if rec is not None else len(rows)) - OVER_BUDGET_ROWS)
        rows = rows[first:first + top]
    for i, p in rows:
        fits = p.peak_memory_bytes <= res.budget_bytes
        mark = "[bold green]*best[/]" if i == rec else ("" if fits else "[dim]over[/]")
        if choice is not None and i == choice.nominal_index != rec:
            mark = "fastest"
        t.add_row(str(i), mark, f"{p.step_time_s:.3f}", f"{p.tokens_per_s_per_gpu:,.0f}",
                  f"{100 * p.mfu:.1f}%", f"{p.peak_memory_gib:.1f}", p.plan.notation(),
                  style=None if fits else "dim")
    con.print(t)
    if rec is not None:
        p = res.frontier[rec]
        pp = p.plan.dims.pp
        per_rank = [sum(p.plan.stage_layers[i::pp]) for i in range(pp)]
        rec_rank = [sum(p.plan.recompute_layers[i::pp]) for i in range(pp)]
        con.print(f"recommended (#{rec}): {p.plan.notation()}  layers per pipeline rank {per_rank}"
                  + (f"  recomputed per rank {rec_rank}" if any(rec_rank) else ""))
        # the target's calibration gave these step times: estimate gives them back only with it
        on = "" if target == Target.MESHPLAN else f" --target {target.value}"
        con.print(f"as flags (meshplan estimate ...): {plan_argv(p.plan)}{on}", soft_wrap=True, markup=False)
        con.print(f"why: {choice.why}", soft_wrap=True, markup=False, highlight=False)


def _print_scaling(con, results, training) -> None:
    t = Table(title="Scaling: fastest fitting plan per GPU count (frontier over GPUs and step time)")
    for col in ("GPUs", "frontier", "step s", "tok/s/GPU", "MFU", "GPU-h per 1B tokens", "plan"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for row in _scaling_rows(results, training):
        if row["plan"] is None:
            t.add_row(str(row["num_gpus"]), "", "-", "-", "-", "-", "nothing fits")
            continue
        t.add_row(str(row["num_gpus"]), "yes" if row["on_frontier"] else "", f"{row['step_time_s']:.3f}",
                  f"{row['tokens_per_s_per_gpu']:,.0f}", f"{100 * row['mfu']:.1f}%",
                  f"{row['gpu_hours_per_billion_tokens']:.2f}", row["plan"])
    con.print(t)
