"""Activation offload copies (cost.offload): the copy stream's stall under Transformer Engine's
offload schedule equals an event simulation of that schedule, and each GPU's copy rate is capped by
its share of the node's host DRAM."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost.offload import activation_copy_bytes_per_s, offload_schedule_exposed_s
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import cluster_for_gpu


def _simulated_stall_s(copy_s: float, layer_s: float, offloaded: int, layers: int) -> float:
    """One pass of ``layers`` layers of ``layer_s``; layer i < N is copied on one stream once its
    pass ends, and the pass waits for that copy before layer L - N + i (TE's
    OffloadSynchronizer._default_offload_sync_init); returns the time the pass waited."""
    clock, stream_free, done, waited = 0.0, 0.0, {}, 0.0
    for layer in range(layers):
        i = layer - (layers - offloaded)  # the copy due before this layer
        if i >= 0 and done[i] > clock:
            waited += done[i] - clock
            clock = done[i]
        clock += layer_s
        if layer < offloaded:
            stream_free = max(stream_free, clock) + copy_s
            done[layer] = stream_free
    return waited


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.data(), st.floats(0.0, 5.0), st.floats(0.01, 2.0))
def test_closed_form_equals_simulated_schedule(layers, data, copy_s, layer_s):
    offloaded = data.draw(st.integers(1, layers - 1))
    got = float(offload_schedule_exposed_s(copy_s, layer_s, offloaded, layers))
    assert got == pytest.approx(_simulated_stall_s(copy_s, layer_s, offloaded, layers), rel=1e-9, abs=1e-12)


def test_no_offloaded_layer_no_stall():
    assert float(offload_schedule_exposed_s(1.0, 0.1, 0, 8)) == 0.0


def test_copy_rate_is_the_lower_of_link_and_dram_share():
    h100 = cluster_for_gpu("h100-sxm")  # PCIe 55 GB/s per GPU; 614.4 GB/s DDR5 x 0.5 / 8 = 38.4 GB/s
    assert activation_copy_bytes_per_s(h100) == pytest.approx(614.4e9 * 0.5 / 8)
    fast_dram = replace(h100, host_memory_bandwidth_bytes_per_s=8 * 200e9)
    assert activation_copy_bytes_per_s(fast_dram) == pytest.approx(55e9)
    with pytest.raises(MeshplanError, match="host_memory_stream_efficiency"):
        replace(h100, host_memory_stream_efficiency=0.0)
