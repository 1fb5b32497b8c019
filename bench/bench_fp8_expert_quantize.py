"""Can Transformer Engine's per-expert fp8 quantization explain the slow Qwen3-30B-A3B H100 fp8 rows?
(a bench; session 10 round 3; nothing here is fitted or shipped)

    PYTHONPATH=src python bench/bench_fp8_expert_quantize.py
    PYTHONPATH=src python bench/bench_fp8_expert_quantize.py --kernel-us 0 5 10 40 --json

The hypothesis: on Hopper, TE's GroupedLinear quantizes each local expert's input (forward) and
output gradient (backward) with its own kernels. The source holds it for every recipe but delayed
scaling: ``split_quantize`` -> ``multi_tensor_quantize_impl`` has one fused
``nvte_multi_cast_transpose`` only when every quantizer is a delayed-scaling ``Float8Quantizer``,
otherwise "Quantize kernels individually", one call per split
(NVIDIA/TransformerEngine transformer_engine/pytorch/csrc/extensions/cast.cpp@006b3360afdb3c0bec9fada4a2284ff7023ea51a);
a current-scaling call is an amax kernel, the scale from the amax and the cast
(``Float8CurrentScalingQuantizer::quantize_impl``, csrc/quantizer.cpp of the same repository:
``nvte_compute_amax_with_config``, then the scale, then the cast). The Bridge's H100 Qwen3 preset
is current scaling (``QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1``, bridge_recipes.csv).

The model already charges a fixed time per local expert GEMM (``Calibration.moe_expert_gemm_s``,
fitted: 30 us on Hopper; its prior's source names the launch, the fp8 cast and the last wave), for
bf16 and fp8 alike. This bench adds the quantize kernels on top, on the rows they apply to (Hopper,
fp8, MoE, no fused grouped MLP), as ``QUANTIZE_KERNELS`` kernels per quantize call at ``--kernel-us``
each: per local expert and micro-batch 2 calls forward (fc1 and fc2 inputs) and 2 backward (their
output gradients; weights are quantized once per step), against the 2 + 4 expert GEMMs the model
charges ``moe_expert_gemm_s`` for (backward = 2 x forward, cost/layer.py), so each expert GEMM
gets 4 * 3 / 6 = 2 kernels more. It prints the rows' errors, the Bridge median / p90 and the
signed fp8 / MoE medians for each kernel time, and the time per (layer, micro-batch) the model
misses on the slow rows (per token too) with the kernel time it would take to close it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

from meshplan.calib.validate import evaluate, load_runs
from meshplan.cost.calibration import calibration_for
from meshplan.data.published import runs_csv
from meshplan.cost.calib_records import gpu_generation

QUANTIZE_KERNELS = 3
"""Kernels of one current-scaling quantize call: amax, scale, cast (quantizer.cpp, above)."""
QUANTIZE_CALLS_PER_EXPERT = 4
"""Per local expert and micro-batch: fc1 / fc2 inputs forward, their output gradients backward."""
EXPERT_GEMMS_CHARGED = 6
"""Expert GEMMs the model charges ``moe_expert_gemm_s`` for per expert and micro-batch: 2 forward,
4 backward (backward = 2 x forward)."""
ROWS = ("466", "503", "539", "559", "335", "376", "422")
"""The Qwen3-30B-A3B H100 rows: 503 (26.02) and 466 (26.02.01) one layout, 539 (25.11) and 559
(25.09, token drop, precision not published) another, 335/376/422 (26.04+) the ep16 preset."""


def applies(run) -> bool:
    return (gpu_generation(run.cluster.gpu) == "hopper" and run.training.precision.value == "fp8"
            and run.model.is_moe)


def report(runs, skipped, kernel_s: float) -> dict[str, Any]:
    extra = kernel_s * QUANTIZE_KERNELS * QUANTIZE_CALLS_PER_EXPERT / EXPERT_GEMMS_CHARGED

    def calib_for(run):
        calib = calibration_for(run.cluster.gpu, run.stack)
        if applies(run) and not calib.moe_fused_grouped_mlp:
            return calib.replace_fields(moe_expert_gemm_s=calib.moe_expert_gemm_s + extra)
        return calib

    rows = [r for r in evaluate(runs, skipped, calib_for=calib_for).rows if r.error is not None]
    err = np.array([abs(r.error) for r in rows])
    signed = {key: statistics.median([r.error for r in rows if pick(r)]) for key, pick in (
        ("fp8", lambda r: r.precision == "fp8"), ("moe", lambda r: r.moe),
        ("hopper fp8 moe", lambda r: r.generation == "hopper" and r.precision == "fp8" and r.moe))}
    return {"kernel_us": kernel_s * 1e6, "rows": len(rows), "median_abs": float(np.median(err)),
            "p90_abs": float(np.percentile(err, 90)), "signed_median": signed,
            "row_errors": {r.row_id: r.error for r in rows if r.row_id in ROWS},
            "affected_rows": sum(1 for r in runs if applies(r))}


def missing_per_layer_microbatch(runs, skipped) -> dict[str, dict[str, float]]:
    """Measured minus predicted step time, per (layer, micro-batch) one GPU runs, for the rows."""
    by_id = {r.row_id: r for r in runs}
    out = {}
    for res in evaluate(runs, skipped).rows:
        if res.row_id not in ROWS or res.error is None:
            continue
        run = by_id[res.row_id]
        measured_step_s = res.predicted_step_s * (1.0 + res.error)  # the metric is a rate
        tr, plan = run.training, run.plan
        micro_batches = plan.num_microbatches(tr)
        layers = run.model.num_layers / plan.dims.pp
        gap_s = (measured_step_s - res.predicted_step_s) / (micro_batches * layers)
        local_experts = run.model.moe_num_experts / plan.dims.ep
        kernels = local_experts * QUANTIZE_CALLS_PER_EXPERT * QUANTIZE_KERNELS
        out[res.row_id] = {"predicted_step_s": res.predicted_step_s, "measured_step_s": measured_step_s,
                           "missing_ms_per_layer_microbatch": gap_s * 1e3,
                           # a per-kernel cost is the same per (layer, micro-batch) whatever the
                           # micro-batch; a lost rate is the same per token
                           "missing_us_per_token": (measured_step_s - res.predicted_step_s) * 1e6
                           / (tr.global_batch * tr.seq_len / run.cluster.num_gpus),
                           "quantize_kernels_per_layer_microbatch": kernels,
                           "us_per_kernel_to_close": gap_s / kernels * 1e6}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel-us", type=float, nargs="*", default=[0.0, 5.0, 10.0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs, skipped = load_runs(runs_csv("megatron-bridge"))
    out = {"gap": missing_per_layer_microbatch(runs, skipped),
           "sweep": [report(runs, skipped, k * 1e-6) for k in args.kernel_us]}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("time the model misses per (layer, micro-batch) on one GPU, shipped fit:")
    for rid, g in out["gap"].items():
        print(f"  row {rid}: step measured {g['measured_step_s']:.1f} s, predicted {g['predicted_step_s']:.1f} s; "
              f"missing {g['missing_ms_per_layer_microbatch']:+.2f} ms per layer-micro-batch "
              f"({g['missing_us_per_token']:+.1f} us per token) = "
              f"{g['us_per_kernel_to_close']:+.1f} us per each of {g['quantize_kernels_per_layer_microbatch']:.0f} "
              f"quantize kernels")
    for s in out["sweep"]:
        rows = " ".join(f"{rid} {e:+.3f}" for rid, e in sorted(s["row_errors"].items()))
        sg = " ".join(f"{k} {v:+.3f}" for k, v in s["signed_median"].items())
        print(f"{s['kernel_us']:5.1f} us/kernel ({s['affected_rows']} rows charged): median {s['median_abs']:.4f} "
              f"p90 {s['p90_abs']:.4f}; signed {sg}; rows {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
