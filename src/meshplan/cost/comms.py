"""Collective costs as alpha + bytes / bandwidth, mapped onto the two-level topology.

Ring algorithms (Patarasuk & Yuan 2009; NCCL): an all-reduce of B bytes over n ranks moves
2(n-1)/n * B per rank in 2(n-1) steps; an all-gather or reduce-scatter moves (n-1)/n * B
(B = the full, unsharded buffer) in n-1 steps; an all-to-all moves (n-1)/n * B in n-1 steps.

Topology (meshplan.plan): ranks are laid out ``pp, dp_replicate, dp_shard, cp, tp`` with tp innermost,
so the group of an axis has its members ``stride`` ranks apart, stride = product of the inner
axes. The group fits in one NVLink (scale-up) domain iff ``stride * size <= scale_up_gpus`` (a
DGX node of 8, or a whole GB200/GB300 NVL72 rack of 72 even though its hosts are 4-GPU trays;
jobs place whole groups inside a rack, e.g. 64 of its 72 GPUs); then it runs at NVLink speed,
else at the NICs'. A group spanning domains gets the node's NIC bandwidth per GPU
(``ClusterSpec.inter_node_bandwidth_bytes_per_s``: NICs x line rate / GPUs per node) whether one
or several of its members share a node.

All functions take and return NumPy arrays (or scalars) and broadcast: no Python branching on
plan values, so one plan or a million plans evaluate with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class Link:
    """Effective per-GPU bandwidth W (bytes/s) and latency alpha (s) of a group, as arrays, and
    the calibration whose per-op factors scale them for each collective."""

    bandwidth_bytes_per_s: np.ndarray
    latency_s: np.ndarray
    calib: Calibration = Calibration()

    def rates(self, op: str) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, W) of collective ``op`` on this link (Calibration.collective_factors)."""
        lat_f, bw_f = self.calib.collective_factors(op)
        return self.latency_s * lat_f, self.bandwidth_bytes_per_s * bw_f


def group_link(cluster: ClusterSpec, calib: Calibration, size, stride) -> Link:
    """Link of a group of ``size`` ranks ``stride`` ranks apart (see module docstring)."""
    size = np.asarray(size, dtype=float)
    stride = np.asarray(stride, dtype=float)
    inside = stride * size <= cluster.scale_up_gpus
    bw = np.where(
        inside,
        cluster.intra_node_bandwidth_bytes_per_s * calib.intra_node_comm_efficiency,
        cluster.inter_node_bandwidth_bytes_per_s * calib.inter_node_comm_efficiency,
    )
    lat = np.where(inside, cluster.intra_node_latency_s, cluster.inter_node_latency_s)
    return Link(bandwidth_bytes_per_s=bw, latency_s=lat, calib=calib)


def all_reduce_time(nbytes, size, link: Link):
    """Ring all-reduce of an ``nbytes`` buffer: 2(n-1)/n * B / W + 2(n-1) alpha."""
    n = np.asarray(size, dtype=float)
    alpha, w = link.rates("all_reduce")
    return 2.0 * (n - 1) / n * nbytes / w + 2.0 * (n - 1) * alpha


def _ring_time(op: str, nbytes, size, link: Link):
    """(n-1)/n * B / W + (n-1) alpha with the op's own alpha and W."""
    n = np.asarray(size, dtype=float)
    alpha, w = link.rates(op)
    return (n - 1) / n * nbytes / w + (n - 1) * alpha


def all_gather_time(nbytes, size, link: Link, op: str = "all_gather"):
    """Ring all-gather producing an ``nbytes`` buffer: (n-1)/n * B / W + (n-1) alpha (``op``:
    "tp_all_gather" for TP + SP's gather along the sequence, with its own rates)."""
    return _ring_time(op, nbytes, size, link)


def reduce_scatter_time(nbytes, size, link: Link, op: str = "reduce_scatter"):
    """Ring reduce-scatter of an ``nbytes`` buffer: the traffic of an all-gather."""
    return _ring_time(op, nbytes, size, link)


def all_to_all_time(nbytes, size, link: Link):
    """All-to-all of ``nbytes`` held per rank: (n-1)/n of it leaves the rank."""
    return _ring_time("all_to_all", nbytes, size, link)


def p2p_time(nbytes, active, link: Link):
    """One send/recv of ``nbytes``; zero where ``active`` is False (no peer)."""
    alpha, w = link.rates("send_recv")
    return np.where(active, nbytes / w + alpha, 0.0)


def exposed(comm_s, overlap_fraction, window_s):
    """Communication left on the critical path: comm - min(overlap * comm, window), >= 0."""
    hidden = np.minimum(overlap_fraction * comm_s, np.maximum(window_s, 0.0))
    return np.maximum(comm_s - hidden, 0.0)
