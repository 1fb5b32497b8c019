"""The host probe (profile.compute.bench_host_per_kernel): eager PyTorch's host time per kernel.

A chain of n tiny muls, forward + backward, is 2n kernels of nil math: its time grows by the
host's dispatch cost per kernel, microseconds on any CPU (Python, the dispatcher, autograd).
"""

import pytest
import torch

from meshplan.profile.compute import HOST_PROBE_OPS, bench_host_per_kernel

pytestmark = pytest.mark.runtime


def test_host_per_kernel_is_microseconds_on_cpu():
    torch.set_num_threads(1)
    # A measurement on a shared host: another process can stall either chain, so up to three
    # tries; a probe that is wrong (0, or milliseconds) fails every one.
    tries = [bench_host_per_kernel(torch.device("cpu"), budget_s=0.2) for _ in range(3)]
    assert any(1e-7 < s < 2e-4 for s in tries), tries
    few, many = HOST_PROBE_OPS
    assert many > few  # the difference of two chains, not one chain's fixed cost
