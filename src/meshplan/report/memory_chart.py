"""Per pipeline rank memory breakdown as stacked bars (parameters, gradients, optimizer states,
activations, other), with the GPU's capacity as a line. Values from the cost model's
``Estimate.stages[r].memory`` (bytes on one GPU of that rank)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from meshplan.spec.cluster import GIB

if TYPE_CHECKING:
    from meshplan.cost.step import Estimate

PARTS = (
    ("parameters", "parameters_bytes", "#4C78A8"),
    ("gradients", "gradients_bytes", "#72B7B2"),
    ("optimizer", "optimizer_bytes", "#F58518"),
    ("activations", "activations_bytes", "#E45756"),
    ("other", "other_bytes", "#BAB0AC"),
    ("allocator reserve", "reserve_bytes", "#D8D8D8"),
)


def memory_rows_gib(est: "Estimate") -> list[dict[str, float]]:
    """One row per pipeline rank: GiB per part."""
    return [{name: getattr(s.memory, attr) / GIB for name, attr, _ in PARTS} for s in est.stages]


def memory_png(est: "Estimate", title: str = "") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = memory_rows_gib(est)
    ranks = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 + 0.6 * len(rows)), 4.2), dpi=110)
    bottom = [0.0] * len(rows)
    for name, _, color in PARTS:
        vals = [r[name] for r in rows]
        ax.bar(ranks, vals, bottom=bottom, color=color, label=name, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(est.gpu_memory_gib, color="black", linestyle="--", linewidth=1)
    ax.text(-0.4, est.gpu_memory_gib, f"GPU {est.gpu_memory_gib:.0f} GiB", va="bottom", ha="left", fontsize=8)
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(max(bottom), est.gpu_memory_gib) * 1.12)
    ax.set_title(title or "Memory per GPU by pipeline rank", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
