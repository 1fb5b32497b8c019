"""Physical bounds and weak priors of the fitted time factors (issue 14 item 6).

Every field the fit moves (calib/fit.py ``TIME_GRID``) gets a range it may not leave, with the
source of that range, and a scale on which the fit pays for leaving its start: the literature
default of ``Calibration`` or the stack's mechanism (``fit_start``), each cited where it is
defined. The penalty is a Laplace prior (MAP estimation, Bishop 2006 Sec. 3.3; the lasso's L1
term, Tibshirani 1996) on the distance from the start as a share of the field's range, on a log
scale for positive rates and efficiencies, on a linear one for fields whose default is 0
(overheads, overlaps): a value the rows do not pay for stays at its cited start instead of
drifting to a grid edge, and a value the rows do pay for moves as before.

Bounds are where a value stops being a property of the hardware or the stack and starts to
stand for a cost the model lacks (a missing term elsewhere absorbed by an impossible link or
kernel): the fit is not allowed there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from meshplan.errors import MeshplanError


@dataclass(frozen=True, kw_only=True)
class FieldPrior:
    """The range a fitted field may take and how far its start is from a value."""

    low: float
    high: float
    log_scale: bool
    """Distance as |ln(v / start)| over ln(high / low) (rates, efficiencies, sizes: a factor of 2
    is the same evidence wherever it is); else |v - start| over (high - low) (fields that may be
    0: fixed overheads and overlap fractions)."""
    source: str
    """Why the range stops where it does."""

    def __post_init__(self) -> None:
        if not (self.high > self.low) or (self.log_scale and self.low <= 0):
            raise MeshplanError(f"prior range [{self.low}, {self.high}] is empty or not positive on a log scale")

    def distance(self, value: float, start: float) -> float:
        """Share of the range between ``value`` and ``start`` (0: at the start, 1: across it)."""
        if self.log_scale:
            lo = max(self.low, 1e-300)
            return abs(math.log(max(value, lo) / max(start, lo))) / math.log(self.high / self.low)
        return abs(value - start) / (self.high - self.low)


_NCCL = ("nccl-tests doc/PERFORMANCE.md bus bandwidth at large messages: ~80% of the NVLink link rate "
         "on DGX A100/H100 rings (~360-370 GB/s of 450), 90-95% of the NIC line rate over InfiniBand "
         "NDR (46-48 GB/s of 50)")

FIELD_PRIORS: Mapping[str, FieldPrior] = MappingProxyType({
    "matmul_efficiency": FieldPrior(
        low=0.45, high=0.90, log_scale=True,
        source="best achievable bf16 matmul share of peak (Bekman, ML Engineering, MAMF table: A100 85.9%, "
               "H100 80.1%), rounded up to 0.90; below half of it a GEMM is not slower cuBLAS but a cost "
               "the model lacks"),
    "matmul_half_dim": FieldPrior(
        low=16.0, high=512.0, log_scale=True,
        source="one MMA row of tensor-core tiles (16) to two of the largest CTA tiles (2 x 256): NVIDIA "
               "matrix-multiplication background guide, 'tile quantization'"),
    "attention_efficiency": FieldPrior(
        low=0.3, high=0.9, log_scale=True,
        source="fused attention forward+backward: FlashAttention-2 30-73% (Dao 2023 Sec. 4.1), "
               "FlashAttention-3 up to ~75% of H100 bf16 peak (Shah et al. 2024 Fig. 5)"),
    "elementwise_time_factor": FieldPrior(
        low=1.0, high=3.0, log_scale=True,
        source="one HBM round trip per memory-bound op at the achievable rate (fused Megatron/TE kernels: "
               "norm, bias-swiglu, bias-dropout-add, cost/layer.py) to three: TE's fp8 cast_transpose "
               "writes the data and its transpose and the amax reduction reads it again (Transformer "
               "Engine docs, 'FP8 primer', delayed/current scaling), and autograd keeps a saved copy; "
               "eager torchtitan code runs 2-4x the fused bytes (cost/eager_passes.py)"),
    "intra_node_comm_efficiency": FieldPrior(
        low=0.6, high=0.9, log_scale=True,
        source=_NCCL + "; 0.6 leaves room for mid-size messages, 0.9 for NVLink SHARP. Not ordered against "
               "inter_node_comm_efficiency: the same nccl-tests put InfiniBand above NVLink as a share of "
               "the line rate, while NVLink's rate is 9-18x a NIC's, so the ranges bound the physics"),
    "inter_node_comm_efficiency": FieldPrior(
        low=0.6, high=0.95, log_scale=True,
        source=_NCCL + "; 0.95 is the best nccl-tests shows, 1.0 (the line rate itself) is not reachable"),
    "dp_overlap": FieldPrior(
        low=0.0, high=1.0, log_scale=False, source="a fraction of the gradient reduction hidden"),
    "layer_overhead_s": FieldPrior(
        low=0.0, high=3e-3, log_scale=False,
        source="a Megatron layer forward is ~30-60 kernels at 5-20 us of launch and dispatch each "
               "(PyTorch blog 'Accelerating PyTorch with CUDA Graphs', 2021): at most 1.2 ms, plus the "
               "TP collectives' per-call latency"),
    "host_s_per_kernel": FieldPrior(
        low=2e-6, high=40e-6, log_scale=True,
        source="cudaLaunchKernel alone ~2-5 us; an eager PyTorch op with its Python frame and dispatcher "
               "5-20 us (PyTorch blog 'Accelerating PyTorch with CUDA Graphs', 2021); a Transformer Engine "
               "module's Python path per kernel up to ~2x that (the reason TE offers CUDA graphs)"),
    "unaligned_matmul_factor": FieldPrior(
        low=0.05, high=1.0, log_scale=True,
        source="non-tensor-core fallback (~1/16 of the tensor-core rate on A100/H100 bf16, NVIDIA "
               "Deep Learning Performance guide 'Tensor Core requirements') to no penalty"),
    "comm_half_message_bytes": FieldPrior(
        low=0.0, high=256e6, log_scale=False,
        source="nccl-tests bus bandwidth saturates at hundreds of MB on 8 GPUs (NCCL performance docs)"),
    "tp_overlap": FieldPrior(
        low=0.0, high=1.0, log_scale=False, source="a fraction of the TP collectives hidden"),
    "ep_overlap": FieldPrior(
        low=0.0, high=1.0, log_scale=False, source="a fraction of the expert all-to-all hidden"),
    "microbatch_overhead_s": FieldPrior(
        low=0.0, high=16e-3, log_scale=False,
        source="host work of one micro-batch's schedule (loss, p2p posts, hooks): milliseconds, not tens"),
    "fp8_matmul_factor": FieldPrior(
        low=0.6, high=1.0, log_scale=True,
        source="cuBLASLt fp8 GEMMs reach 1.2-2x the bf16 rate at the same shape (NVIDIA Transformer "
               "Engine performance notes): 0.6-1.0 of the fp8 peak's share"),
    "fp4_matmul_factor": FieldPrior(
        low=0.5, high=1.0, log_scale=True,
        source="NVFP4 GEMMs ~1.5x the fp8 rate on training shapes rather than 2x (NVIDIA 2025 NVFP4 "
               "pretraining report): 0.5-1.0"),
    "moe_alltoall_sync_s": FieldPrior(
        low=0.0, high=6e-3, log_scale=False,
        source="a MoE layer's ~100 kernels launched after the sync at 5-20 us each (PyTorch blog 2021), "
               "forward and backward: up to ~6 ms"),
    "moe_grouped_gemm_half_dim": FieldPrior(
        low=64.0, high=1024.0, log_scale=True,
        source="a grouped GEMM falls off at least as fast as a single GEMM's tile (64) and at most at "
               "four 256-wide tiles per member (Megatron-Core MoE docs, 'grouped GEMM')"),
    "moe_expert_gemm_s": FieldPrior(
        low=0.0, high=50e-6, log_scale=False,
        source="one GEMM launch with its fp8 cast and last partial wave per local expert: tens of us"),
    "mamba_scan_efficiency": FieldPrior(
        low=0.02, high=0.35, log_scale=True,
        source="the SSD kernels' roofline: ~0.1 of peak at full bandwidth, less with the backward's "
               "recomputed states (cost/calibration.py mamba_scan_efficiency)"),
    "moe_grouped_gemm_efficiency": FieldPrior(
        low=0.5, high=1.0, log_scale=True,
        source="TE's GroupedLinear: one cuBLASLt call per local expert with its own casts, at most as "
               "fast as one GEMM"),
})
"""Range, scale and source of every fitted time field (calib/fit.py ``TIME_GRID``,
``SPECIFIC_GRID``): a test checks none is missing."""


def grid_with_start(grid: tuple[float, ...], start: float) -> tuple[float, ...]:
    """``grid`` with the field's start on it (sorted): a start off the grid (the kernel table's
    0.44 for cuDNN on Blackwell, between the grid's 0.4 and 0.5) can be left and found again, and the
    prior, centred on the start, is zero at a grid point."""
    return tuple(sorted({*grid, float(start)}))


def bounded_grid(name: str, values: tuple[float, ...]) -> tuple[float, ...]:
    """``values`` of field ``name``'s grid inside its physical range (all of them without a prior)."""
    prior = FIELD_PRIORS.get(name)
    if prior is None:
        return tuple(values)
    kept = tuple(v for v in values if prior.low - 1e-12 <= v <= prior.high + 1e-12)
    if not kept:
        raise MeshplanError(f"fit grid of {name} lies outside its range [{prior.low}, {prior.high}]")
    return kept

