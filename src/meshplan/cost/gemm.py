"""The time of one GEMM: 2mnk FLOPs over the rate its shape reaches (the scaling book's
T_math = FLOPs / C, with C a fraction of peak that grows with the smallest dimension)."""

from __future__ import annotations

import numpy as np

from meshplan.cost.calibration import Calibration


def gemm_efficiency(calib: Calibration, m, n, k):
    """Achieved fraction of peak for an (m x k) @ (k x n) GEMM (see Calibration fields)."""
    x = np.minimum(np.minimum(m, n), k)
    aligned = (np.mod(n, 8) == 0) & (np.mod(k, 8) == 0)
    return (calib.matmul_efficiency * x / (x + calib.matmul_half_dim)
            * np.where(aligned, 1.0, calib.unaligned_matmul_factor))


def gemm_time(calib: Calibration, peak_flops: float, m, n, k):
    """2mnk FLOPs at the shape's achievable rate; m, n, k per GPU."""
    return 2.0 * m * n * k / (peak_flops * gemm_efficiency(calib, m, n, k))
