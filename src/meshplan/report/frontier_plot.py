"""Plot of the (peak memory, step time) frontier with the memory budget and the recommended plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GIB

if TYPE_CHECKING:
    from meshplan.search.planner import SearchResult


def plot_frontier(results: "list[SearchResult]", path: str | Path, *, title: str = "", yours=None,
                  recommended: "list[int | None] | None" = None) -> Path:
    """Write a PNG/SVG/PDF: one step-staircase per GPU count, the budget line, the pick starred
    (``recommended``: frontier index per result, default each search's fastest that fits);
    ``yours`` (a cost point: ``plan``, ``step_time_s``, ``peak_memory_gib``) drawn as a diamond."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    out = Path(path)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    try:
        budgets = set()
        for k, res in enumerate(results):
            if not res.frontier:
                continue
            mem = [p.peak_memory_gib for p in res.frontier]
            t = [p.step_time_s for p in res.frontier]
            line, = ax.step(mem, t, where="post", marker="o", markersize=3, linewidth=1.2,
                            label=f"{res.num_gpus} GPUs ({len(res.frontier)} plans)")
            rec = res.recommended if recommended is None or recommended[k] is None else res.frontier[recommended[k]]
            if rec is not None:
                ax.plot([rec.peak_memory_gib], [rec.step_time_s], marker="*", markersize=16,
                        color=line.get_color(), markeredgecolor="black", linestyle="none")
                ax.annotate(rec.plan.notation(), (rec.peak_memory_gib, rec.step_time_s),
                            textcoords="offset points", xytext=(8, 8), fontsize=7)
            budgets.add(res.budget_bytes / GIB)
        if yours is not None:
            ax.plot([yours.peak_memory_gib], [yours.step_time_s], marker="D", markersize=9, color="black",
                    linestyle="none", label=f"yours: {yours.plan.notation()}")
        for b in sorted(budgets):
            ax.axvline(b, color="crimson", linestyle="--", linewidth=1.0)
            ax.text(b, ax.get_ylim()[1], f" budget {b:.1f} GiB", color="crimson", fontsize=8,
                    va="top", ha="left")
        ax.set_xlabel("peak memory per GPU (GiB)")
        ax.set_ylabel("step time (s, log scale)")
        ax.set_yscale("log")  # the leanest plans are often 10-100x slower than the fastest
        ax.set_title(title or "Pareto frontier of plans (star: recommended)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        try:
            fig.savefig(out)
        except (OSError, ValueError) as exc:
            raise MeshplanError(f"cannot write plot {out}: {exc}") from None
    finally:
        plt.close(fig)
    return out
