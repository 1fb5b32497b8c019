"""Rich tables shared by the commands that print one cost estimate (`estimate`, `explain`)."""

from __future__ import annotations

from rich.table import Table


def time_breakdown_table(est, title: str) -> Table:
    """The critical-path parts of one step (``Estimate.time``), in seconds and share of the step."""
    t = Table(title=title)
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    tb = est.time
    osdp = _uses_osdp(est.plan)
    for name, v in (("compute (incl. recompute)", tb.compute_s), ("  of which recompute", tb.recompute_s),
                    *((("  of which OSDP splits", tb.osdp_compute_s),) if osdp else ()),
                    ("exposed communication", tb.exposed_communication_s), ("pipeline bubble", tb.bubble_s),
                    ("optimizer", tb.optimizer_s)):
        t.add_row(name, f"{v:.3f}", f"{v / est.step_time_s:.1%}")
        if name == "exposed communication":  # by kind (TimeBreakdown.terms_s), the non-zero ones
            for kind, s in tb.terms_s().items():
                if s > 0 and (kind.startswith("exposed ") or kind == "collective host overhead"):
                    t.add_row(f"  {kind.replace('exposed ', 'of which ')}", f"{s:.3f}", f"{s / est.step_time_s:.1%}")
    if est.plan.offload:
        v = tb.offload_s
        t.add_row("offload (host copies, CPU Adam)", f"{v:.3f}", f"{v / est.step_time_s:.1%}")
    return t


def _uses_osdp(plan) -> bool:
    return bool(plan.keep_gathered) or plan.mlp_splits > 1 or plan.head_splits > 1


def osdp_memory_rows(est) -> list[tuple[str, float]]:
    """The memory parts OSDP changes, as ``(label, GiB)`` rows under their categories (empty
    when the plan does not use it)."""
    if not _uses_osdp(est.plan):
        return []
    g = est.memory.osdp_gib()
    return [("  parameters: kept gathered (OSDP)", g["kept_gathered"]),
            ("  other: gathered layer buffer", g["gathered_buffer"]),
            ("  activations: logits at once", g["logits"])]


def expert_load_table(est, source: str, options, uniform_s: float) -> Table:
    """The expert load on this plan (``Estimate.expert_load``) and, per placement choice
    (cost/expert_gain.py), the busiest rank's load, the drop and the step time; ``uniform_s`` the
    step with evenly spread tokens."""
    st = est.expert_load
    t = Table(title=f"Expert load ({source}): busiest expert {st.imbalance:.2f}x the mean, "
                    f"dropped {st.dropped_fraction:.1%}; evenly routed the step would take {uniform_s:.3f} s")
    for col in ("placement", "replicas", "busiest rank / mean", "step s", "vs this plan", "memory GiB", "fits"):
        t.add_column(col, justify="right")
    for o in options:
        mine = o.placement == est.plan.expert_placement and o.replicas == est.plan.expert_replicas
        t.add_row(("* " if mine else "") + o.placement.value, str(o.replicas), f"{o.load_factor:.3f}",
                  f"{o.step_time_s:.3f}", f"{o.step_time_s / est.step_time_s - 1:+.1%}",
                  f"{o.peak_memory_gib:.1f}", "yes" if o.fits else "no")
    return t


def data_aware_table(data, training) -> Table:
    """Step time of one plan under the data's document lengths (cost/data_aware.DataAwareSteps)."""
    dist = training.seq_len_dist
    t = Table(title=f"Packed documents ({dist.source or 'distribution'}: {dist.num_documents:,} documents, "
                    f"mean {dist.mean_length:,.0f} tokens; doc-balance {training.doc_balance.value}, "
                    f"cp-buckets {'on' if training.cp_buckets else 'off'})")
    t.add_column("step time of this plan")
    t.add_column("seconds", justify="right")
    t.add_column("vs fixed", justify="right")
    for name, v in (("every sequence one document", data.full_sequences_s),
                    ("fixed: data order, CP on every sequence", data.fixed_s),
                    ("as chosen", data.chosen_s),
                    ("data-aware: balanced, per-bucket CP", data.aware_s),
                    ("bound: perfectly balanced", data.balanced_bound_s)):
        t.add_row(name, f"{v:.3f}", f"{v / data.fixed_s - 1:+.1%}")
    t.add_row("straggler cost (as chosen)", f"{data.straggler_s:.3f}", "")
    return t
