"""Collective costs as alpha + bytes / bandwidth, mapped onto the two-level topology.

Ring algorithms (Patarasuk & Yuan 2009; NCCL): an all-reduce of B bytes over n ranks moves
2(n-1)/n * B per rank in 2(n-1) steps; an all-gather or reduce-scatter moves (n-1)/n * B
(B = the full, unsharded buffer) in n-1 steps; an all-to-all moves (n-1)/n * B in n-1 steps.

Topology (meshplan.plan): ranks are laid out ``pp, dp_replicate, dp_shard, cp, tp`` with tp innermost,
so the group of an axis has its members ``stride`` ranks apart, stride = product of the inner
axes. The group fits in one NVLink (scale-up) domain iff ``stride * size <= scale_up_gpus`` (a
DGX node of 8, or a whole GB200/GB300 NVL72 rack of 72 even though its hosts are 4-GPU trays;
jobs place whole groups inside a rack, e.g. 64 of its 72 GPUs); then it runs at NVLink speed,
else at the NICs'. A group spanning domains sends over the NICs
(``ClusterSpec.inter_node_bandwidth_bytes_per_s``: NICs x line rate / GPUs per node, per GPU):
* a ring collective (all-reduce, all-gather, reduce-scatter) with g members in each domain runs
  as NCCL builds it, one ring per channel, each channel leaving the domain through a different
  member's NIC: only the ring's domain-crossing edges use NICs, and the channels spread those
  edges over the g members' NICs, so the ring moves at min(NVLink, g x NIC per GPU) (NCCL
  tests' PERFORMANCE.md: across nodes the bus bandwidth is the node's NICs; "How to Scale Your
  Model", GPUs chapter: a collective across nodes runs at the node's egress bandwidth). A group
  with one member per domain (tensor parallel inside, data parallel across) keeps one NIC share.
  ``Calibration.ring_nic_spread`` is the share of the g NICs a stack's rings really use (1:
  NCCL; fitted per generation and stack);
* a send/recv moves each rank's own bytes through its own NIC share;
* an all-to-all over n ranks, g of them in the rank's own domain, is one send/recv per peer,
  all issued at once (NCCL user guide, 'Point-to-point communication': all-to-all as a group of
  ncclSend/ncclRecv): (g-1)/n of the rank's bytes go to domain peers over NVLink and (n-g)/n to
  the other domains through its own NIC share, on separate links at the same time, so it takes
  max(intra bytes / NVLink, inter bytes / NIC) plus each peer's alpha. Inside one domain
  (g = n) this is the ring formula's (n-1)/n * B / W.

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
    """Per GPU: NVLink inside a domain, its NIC share across domains (all-to-all, send/recv)."""
    latency_s: np.ndarray
    calib: Calibration = Calibration()
    ring_bandwidth_bytes_per_s: np.ndarray | None = None
    """Per GPU for ring collectives (module docstring); None: ``bandwidth_bytes_per_s``."""
    domain_members: np.ndarray | None = None
    """Members of the group in one NVLink domain (g; the all-to-all's split, module docstring);
    None: the group is all on one link (``bandwidth_bytes_per_s``)."""
    intra_bandwidth_bytes_per_s: np.ndarray | float = 0.0
    """Per GPU NVLink bandwidth towards the group's members in the same domain."""
    intra_latency_s: np.ndarray | float = 0.0

    def rates(self, op: str) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, W) of collective ``op`` on this link (Calibration.collective_factors)."""
        lat_f, bw_f = self.calib.collective_factors(op)
        w = self.bandwidth_bytes_per_s
        if op not in _POINT_TO_POINT and self.ring_bandwidth_bytes_per_s is not None:
            w = self.ring_bandwidth_bytes_per_s
        return self.latency_s * lat_f, w * bw_f


# Collectives whose bytes each rank sends itself, to its peers, through its own NIC share.
_POINT_TO_POINT = frozenset({"all_to_all", "send_recv"})


def group_link(cluster: ClusterSpec, calib: Calibration, size, stride) -> Link:
    """Link of a group of ``size`` ranks ``stride`` ranks apart (see module docstring)."""
    size = np.asarray(size, dtype=float)
    stride = np.asarray(stride, dtype=float)
    domain = float(cluster.scale_up_gpus)
    inside = stride * size <= domain
    nvlink = cluster.intra_node_bandwidth_bytes_per_s * calib.intra_node_comm_efficiency
    nic = cluster.inter_node_bandwidth_bytes_per_s * calib.inter_node_comm_efficiency
    bw = np.where(inside, nvlink, nic)
    # members of the group in one domain: ranks ``stride`` apart, at most the group
    per_domain = np.clip(np.floor(domain / np.maximum(stride, 1.0)), 1.0, np.maximum(size, 1.0))
    nics = np.maximum(calib.ring_nic_spread * per_domain, 1.0)  # Calibration.ring_nic_spread
    ring = np.where(inside, nvlink, np.minimum(nvlink, nics * nic))
    lat = np.where(inside, cluster.intra_node_latency_s, cluster.inter_node_latency_s)
    return Link(bandwidth_bytes_per_s=bw, latency_s=lat, calib=calib, ring_bandwidth_bytes_per_s=ring,
                domain_members=per_domain,  # = size inside one domain
                intra_bandwidth_bytes_per_s=nvlink, intra_latency_s=cluster.intra_node_latency_s)


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
    """All-to-all of ``nbytes`` held per rank, g of the n ranks in this rank's domain:
    max((g-1)/n * B / W_nvlink, (n-g)/n * B / W_nic) + (g-1) alpha_nvlink + (n-g) alpha_nic
    (module docstring); (n-1)/n * B / W + (n-1) alpha on one link."""
    n = np.asarray(size, dtype=float)
    alpha, w = link.rates("all_to_all")
    if link.domain_members is None:  # one link for the whole group
        return (n - 1.0) / n * nbytes / w + (n - 1.0) * alpha
    lat_f, bw_f = link.calib.collective_factors("all_to_all")
    intra = link.domain_members - 1.0  # domain peers (g <= n: group_link)
    inter = n - link.domain_members  # peers in other domains
    s_per_share = np.maximum(intra * (1.0 / (link.intra_bandwidth_bytes_per_s * bw_f)), inter / w)
    return s_per_share * (nbytes / n) + intra * (link.intra_latency_s * lat_f) + inter * alpha


def domain_members(size, link: Link):
    """g: the group's members in one NVLink domain (all n where the link does not say)."""
    n = np.maximum(np.asarray(size, dtype=float), 1.0)
    return n if link.domain_members is None else np.minimum(link.domain_members, n)


def split_send_time(intra_bytes, inter_bytes, size, link: Link):
    """Per-peer sends of ``intra_bytes`` to domain peers over NVLink and ``inter_bytes`` to the
    other domains over the NIC share, concurrently: the slower part sets the time; one alpha per
    peer (the all-to-all's rates, Calibration.all_to_all_*_factor)."""
    n = np.maximum(np.asarray(size, dtype=float), 1.0)
    alpha, w = link.rates("all_to_all")
    if link.domain_members is None:  # one link for the whole group
        return (intra_bytes + inter_bytes) / w + (n - 1.0) * alpha
    lat_f, bw_f = link.calib.collective_factors("all_to_all")
    g = domain_members(n, link)
    return (np.maximum(intra_bytes / (link.intra_bandwidth_bytes_per_s * bw_f), inter_bytes / w)
            + (g - 1.0) * (link.intra_latency_s * lat_f) + (n - g) * alpha)


def p2p_time(nbytes, active, link: Link):
    """One send/recv of ``nbytes``; zero where ``active`` is False (no peer)."""
    alpha, w = link.rates("send_recv")
    return np.where(active, nbytes / w + alpha, 0.0)


def exposed(comm_s, overlap_fraction, window_s):
    """Communication left on the critical path: comm - min(overlap * comm, window), >= 0."""
    hidden = np.minimum(overlap_fraction * comm_s, np.maximum(window_s, 0.0))
    return np.maximum(comm_s - hidden, 0.0)
