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
    for name, v in (("compute (incl. recompute)", tb.compute_s), ("  of which recompute", tb.recompute_s),
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
