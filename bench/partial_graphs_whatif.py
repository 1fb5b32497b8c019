"""What per-layer (partial) CUDA graphs would change: a what-if, not a mechanism of the model.

Many Megatron-Bridge MoE presets capture parts of each layer with Transformer Engine's graphs
(``cuda_graph_impl='transformer_engine'``, ``cuda_graph_scope`` ['attn', 'moe_router',
'moe_preprocess']); the model knows only whole-iteration graphs (``cuda_graph_full_iteration``)
and charges every other row the full fitted per-layer overhead (``layer_overhead_s``). This bench
takes the shipped estimates and, for the rows whose preset graphs attention, router and preprocess
(:data:`ATTN_SCOPE`, read from the preset files), removes a share of that overhead, and prints the
Megatron-Bridge median / p90 and every row that moves (session 12, issue 14).

    PYTHONPATH=src python bench/partial_graphs_whatif.py
    PYTHONPATH=src python bench/partial_graphs_whatif.py --share 0.5 --rows
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench_gptoss_blackwell import _calib, _step_s  # noqa: E402 (bench/ is on sys.path when run)
from meshplan.calib.validate import Run, load_corrected_runs, predicted_metric
from meshplan.data.published import runs_csv

ATTN_SCOPE = frozenset({
    # scripts/performance/configs/qwen/qwen3_workload_base_configs.py@f29a269 / @01b2977: GB300 V2 and
    # GB200 V1/V2 235B presets: cuda_graph_scope ['attn', 'moe_router', 'moe_preprocess'] (GB300 V1:
    # router and preprocess only; B300 / B200 / H100 235B: no graph)
    "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_BF16_V2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_CS_V2/FP8_MX_V2",
    "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_CS_V2/FP8_MX_V2",
    "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_BF16_V2",
    # scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py@1e7adfa: GB300 / B300 (GB200 /
    # B200 / H100 recompute layernorm + moe_act instead, no graph)
    "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_BF16_V2", "GPT_OSS_120B_PRETRAIN_CONFIG_B300_BF16_V2",
    "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", "GPT_OSS_120B_PRETRAIN_CONFIG_B300_FP8_MX_V2",
    # scripts/performance/configs/deepseek/deepseek_workload_base_configs.py@f0e2c37: GB300 BF16 and every
    # GB200 preset (GB300 FP8 / FP4: cuda_graph_scope []; B300 / B200 / H100: no graph)
    "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_BF16_V2", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_BF16_V2",
    "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_NVFP4_V2",
})
"""Presets (as bridge_recipes.csv labels them) that graph each layer's attention, router and
token preprocessing."""

SHARES = (0.25, 0.5, 0.75, 1.0)
"""Shares of the per-layer overhead taken off the graphed rows (no source fixes it: a what-if)."""


def _error(run: Run, step_s: float) -> float:
    return predicted_metric(run, step_s) / run.measured - 1.0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=None, help="one share (default: each of SHARES)")
    ap.add_argument("--rows", action="store_true", help="list the rows that move")
    args = ap.parse_args(argv)
    runs, _, _ = load_corrected_runs(runs_csv("megatron-bridge"))
    runs = [r for r in runs if r.measured]
    base = {r.row_id: (_calib(r), _error(r, _step_s(r, _calib(r)))) for r in runs}
    print(f"shipped: median {np.median([abs(e) for _, e in base.values()]):.2%}, "
          f"p90 {np.percentile([abs(e) for _, e in base.values()], 90):.2%}")
    for share in (args.share,) if args.share is not None else SHARES:
        errors, moved = [], []
        for r in runs:
            calib, e0 = base[r.row_id]
            if r.preset in ATTN_SCOPE and not calib.cuda_graph_full_iteration:
                e = _error(r, _step_s(r, calib.replace_fields(layer_overhead_s=calib.layer_overhead_s * (1 - share))))
                moved.append((r, e0, e))
            else:
                e = e0
            errors.append(abs(e))
        print(f"share {share:.2f}: median {np.median(errors):.2%}, p90 {np.percentile(errors, 90):.2%}, "
              f"{len(moved)} rows moved")
        if args.rows:
            for r, e0, e in sorted(moved, key=lambda m: (m[0].model.name, m[0].row_id)):
                print(f"  {r.row_id} {r.model.name} {r.cluster.gpu.name} {r.source}: {e0:+.1%} -> {e:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
