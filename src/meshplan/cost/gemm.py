"""The time of one GEMM: 2mnk FLOPs over the rate its shape reaches (the scaling book's
T_math = FLOPs / C, with C a fraction of peak that grows with the smallest dimension)."""

from __future__ import annotations

import numpy as np

from meshplan.cost.calibration import Calibration


def _multiple_of_8(x):
    """``x % 8 == 0`` for finite dimensions (floats or integers below 2**53), without np.mod: a
    float modulo is ~10 ns per element, half of this module's time in the search (DeepSeek-V3 on
    1024 GB200: 12M GEMM shapes per search). x / 8 and the product back are exact in binary
    floating point, so the test is the same bit for bit (tests/planner/test_gemm_aligned.py)."""
    return np.floor(x * 0.125) * 8.0 == x


def gemm_efficiency(calib: Calibration, m, n, k):
    """Achieved fraction of peak for an (m x k) @ (k x n) GEMM (see Calibration fields)."""
    x = np.minimum(np.minimum(m, n), k)
    aligned = _multiple_of_8(n) & _multiple_of_8(k)
    return (calib.matmul_efficiency * x / (x + calib.matmul_half_dim)
            * np.where(aligned, 1.0, calib.unaligned_matmul_factor))


def gemm_time(calib: Calibration, peak_flops: float, m, n, k):
    """2mnk FLOPs at the shape's achievable rate; m, n, k per GPU."""
    return 2.0 * m * n * k / (peak_flops * gemm_efficiency(calib, m, n, k))
