"""Timing one operation on CPU (wall clock) or CUDA (events, no host sync inside the loop)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, iters: int = 5,
            repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean time of ``iters`` back-to-back calls, in seconds.

    CUDA: a pair of events brackets the iterations so launch overhead overlaps the kernels, as in
    a training step. CPU: perf_counter around the loop.
    """
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def iters_for(seconds_per_call: float, budget_s: float, lo: int = 1, hi: int = 100_000) -> int:
    """How many calls fit a time budget, from a first measured call."""
    return max(lo, min(hi, int(budget_s / max(seconds_per_call, 1e-9))))
