"""The attention kernels' rate curves from their published figures (issue 14, item 4): a bench.

    PYTHONPATH=src python bench/attention_curves.py [--json]

For each (generation, kernel) entry of spec/presets/attention_kernels.json with ``figure_points``
(TFLOP/s hand-read from a paper's figure, by pass, mask, head dim and sequence length), the
parameters of the cost model's form (cost/mixers.attention_core_efficiency: E x H / (H + h) x
s / (s + s_half), the backward at its own E_bwd and s_half_bwd, its time attention_backward_ratio
x the forward's at equal efficiency) that match every point best (smallest largest |log error|,
grid search), beside the shipped values and the shipped curve's largest error on the points.
Nothing here is fitted on training runs: the points are the kernels' own benchmarks.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console
from rich.table import Table

from meshplan.cost.attention_kernels import (
    BACKWARD_FLOP_RATIO,
    figure_points,
    kernel_efficiency,
    kernels_with_figures,
)
from meshplan.cost.calibration import Calibration
from meshplan.cost.mixers import attention_core_efficiency

HALF_HEAD_DIMS = range(0, 132, 4)
HALF_SEQS = range(0, 2010, 10)


def _best_scale(pairs):
    """(E, largest |log error|) of rate = E x shape over (measured, shape) pairs, E at the centre
    of the log errors' range (minimises the largest)."""
    logs = [math.log(m / s) for m, s in pairs]
    centre = (max(logs) + min(logs)) / 2.0
    return math.exp(centre), (max(logs) - min(logs)) / 2.0


def derive(points: dict) -> dict:
    """Grid search of the form's parameters on one entry's figure points."""
    peak = points["peak_tflops"]
    seqs = points["seq_len"]
    fwd, bwd = points["forward"], points.get("backward", {})
    best = None
    for h, a, ac in itertools.product(HALF_HEAD_DIMS, range(0, 400, 10), range(100, 2010, 25)):
        pairs = [(v, peak * int(hd) / (int(hd) + h) * s / (s + (ac if mask == "causal" else a)))
                 for mask, by_hd in fwd.items() for hd, vals in by_hd.items() for s, v in zip(seqs, vals)]
        eff, err = _best_scale(pairs)
        if best is None or err < best["forward_max_error"]:
            best = {"attention_efficiency": eff, "attention_half_head_dim": h, "attention_half_seq": a,
                    "attention_half_seq_causal": ac, "forward_max_error": err}
    if bwd:
        h = best["attention_half_head_dim"]
        bb = None
        for ab in HALF_SEQS:
            pairs = [(v, peak * int(hd) / (int(hd) + h) * s / (s + ab))
                     for by_hd in bwd.values() for hd, vals in by_hd.items() for s, v in zip(seqs, vals)]
            eff_b, err = _best_scale(pairs)
            if bb is None or err < bb[2]:
                bb = (eff_b, ab, err)
        best.update(attention_backward_ratio=BACKWARD_FLOP_RATIO * best["attention_efficiency"] / bb[0],
                    attention_backward_half_seq=bb[1], backward_max_error=bb[2])
    return best


def model_tflops(calib: Calibration, peak_tflops: float, head_dim: int, seq_len: int, causal: bool,
                 backward: bool) -> float:
    """The cost model's rate for one figure point, in the figure's FLOP count: the forward at
    attention_core_efficiency; the backward's 2.5x FLOPs over its time, attention_backward_ratio x
    the forward FLOPs at the backward's efficiency."""
    eff = attention_core_efficiency(calib, float(head_dim), float(seq_len), causal, backward=backward)
    return peak_tflops * eff * (BACKWARD_FLOP_RATIO / calib.attention_backward_ratio if backward else 1.0)


def curve_errors(generation: str, kernel: str) -> dict[str, float]:
    """Largest |predicted / published - 1| of the shipped curve over the figure's points, per pass."""
    calib = Calibration(**kernel_efficiency(generation, kernel).fields())
    points = figure_points(generation, kernel)
    out = {}
    for pass_ in ("forward", "backward"):
        errs = [abs(model_tflops(calib, points["peak_tflops"], int(hd), s, mask == "causal", pass_ == "backward")
                    / v - 1.0)
                for mask, by_hd in points.get(pass_, {}).items() for hd, vals in by_hd.items()
                for s, v in zip(points["seq_len"], vals)]
        if errs:
            out[pass_] = max(errs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for generation, kernel in kernels_with_figures():
        entry = kernel_efficiency(generation, kernel)
        rows.append({"generation": generation, "kernel": kernel, "derived": derive(figure_points(generation, kernel)),
                     "shipped": entry.fields(), "shipped_max_error": curve_errors(generation, kernel)})
    con = Console(highlight=False)
    if args.json:
        con.print_json(data=rows)
        return
    t = Table(title="attention kernel curves: derived from the figure points vs shipped")
    for col in ("generation", "kernel", "field", "derived", "shipped"):
        t.add_column(col)
    for r in rows:
        for f, v in r["derived"].items():
            t.add_row(r["generation"], r["kernel"], f, f"{v:.3f}", f"{r['shipped'].get(f, float('nan')):.3f}"
                      if f in r["shipped"] else f"{r['shipped_max_error'].get(f.split('_')[0], float('nan')):.3f}")
    con.print(t)


if __name__ == "__main__":
    main()
