"""One resolution of the hardware a command estimates on: (cluster, hardware profile, precision)
-> (ClusterSpec with the rates the cost model divides by, Calibration with the factors that go
with those rates). Every command that takes ``--cluster-profile`` calls ``resolve_hardware``;
nothing else turns a profile into rates or factors, so the same plan and profile give the same
step time and memory in ``estimate``, ``explain``, ``plan``, ``report``, ``replan``, ``export
--best`` and ``train``'s predicted versus measured.

Without a profile: the cluster as given and its GPU family's calibration
(``cost.calibration.calibration_for``). With one: the profile's measured rates
(``hwprofile.apply_profile_data``; idempotent, so a Job already planned with the profile is
unchanged), the factors fitted from it on top of the family's calibration
(``hwcalib.calibration_from_profile_data``), host time scaled to the job's process count
(``hwcalib.host_time_scaled``). Then how the state is stored: fp32 training keeps no master
copy, CPU memory has no caching allocator (``runtime_storage``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplan.calib.hwcalib import calibration_from_profile_data, host_time_scaled
from meshplan.calib.hwprofile import HardwareProfile, apply_profile_data, load_profile, profile_source
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.training import Precision

FP32_BYTES = 4.0
TARGET_FRAMEWORKS: dict[str, str] = {"megatron": "megatron-core", "torchtitan": "torchtitan"}
"""The framework a ``--target`` stack stands for where the stack also covers older ones: the
megatron stack's published rows include Megatron-LM of 2020-22, but ``--target megatron`` exports
for today's Megatron-Core (export/megatron.py: ``--cpu-offloading``, ``--recompute-modules``),
whose settings (spec/presets/frameworks.json, e.g. activation offload copies overlapped with the
next layers' compute) apply on top of the stack's calibration, as they do for its published rows.
``--target torchtitan`` exports for torchtitan's default (eager) framework, whose settings (torch's
ring attention for context parallel: cost/torch_cp.py, cost/cp_ring_memory.py) apply likewise."""
CPU_DEVICE = "cpu"
"""The GPU name of the ``cpu`` cluster preset: local CPU processes of meshplan's runtime."""


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """A cluster and the calibration of the cost model on it, resolved together."""

    cluster: ClusterSpec
    calib: Calibration


def device_type(cluster: ClusterSpec) -> str:
    """Where meshplan's runtime runs a job on this cluster: ``cpu`` processes or ``cuda`` GPUs."""
    return CPU_DEVICE if cluster.gpu.name == CPU_DEVICE else "cuda"


def resolve_hardware(cluster: ClusterSpec, precision: Precision,
                     profile: str | Path | None = None, stack: str | None = None) -> Hardware:
    """``cluster`` (its GPU count included: a CPU host's share per process depends on it) with
    the rates and factors of ``profile`` when one is given, for matmuls in ``precision``, as
    the training ``stack`` runs them (default: meshplan's runtime; ``calibration_for``)."""
    if profile is None:
        calib = runtime_storage(target_calibration(cluster, stack), precision, device_type(cluster))
        return Hardware(cluster=cluster, calib=calib)
    data = load_profile(profile)
    return resolve_hardware_data(cluster, precision, data, profile_source(data, profile), stack)


def resolve_hardware_data(cluster: ClusterSpec, precision: Precision, profile: HardwareProfile,
                          source: str, stack: str | None = None) -> Hardware:
    """``resolve_hardware`` for a profile already in memory (``source``: its file and date)."""
    cluster = apply_profile_data(cluster, profile)
    calib = calibration_from_profile_data(profile, source, precision, target_calibration(cluster, stack))[0]
    calib = host_time_scaled(calib, profile, cluster.num_gpus)
    return Hardware(cluster=cluster, calib=runtime_storage(calib, precision, device_type(cluster)))


def target_calibration(cluster: ClusterSpec, stack: str | None) -> Calibration:
    """``calibration_for(gpu, stack)`` with the settings of the framework ``stack`` stands for as a
    target (``TARGET_FRAMEWORKS``; none for the others)."""
    calib = calibration_for(cluster.gpu, stack)
    framework = TARGET_FRAMEWORKS.get((stack or "").lower())
    settings = framework_defaults(framework).calibration if framework else {}
    if not settings:
        return calib
    return calib.replace_fields(source=f"{calib.source}; {framework} settings", **settings)


def framework_calibration(cluster: ClusterSpec, precision: Precision, framework: str) -> Calibration:
    """The calibration a published run of ``framework`` (spec/presets/frameworks.json) is
    estimated with, as ``meshplan validate`` does: its stack's, with the framework's settings in
    place of those of the framework the stack stands for as a target (e.g. Megatron-LM 2020-22:
    no fused attention, dropout, no TP communication overlap)."""
    fw = framework_defaults(framework)
    calib = calibration_for(cluster.gpu, fw.stack)
    calib = calib.replace_fields(source=f"{calib.source}; {fw.name} settings", **fw.settings)
    return runtime_storage(calib, precision, device_type(cluster))


def runtime_storage(calib: Calibration, precision: Precision, device: str) -> Calibration:
    """The factors that describe how the state is stored, not the hardware.

    fp32 training (the CPU path: the runtime autocasts on CUDA only): one fp32 copy of each
    weight, fp32 gradients, no master copy (mixed precision is what needs one, Micikevicius et
    al. 2018), fp32 logits and log-softmax. CPU tensors come from malloc, not a caching
    allocator: no fragmentation term.
    """
    changes: dict[str, Any] = {}
    if precision is Precision.FP32:
        changes.update(weight_bytes_per_param=FP32_BYTES,  # fp32 gradients: Calibration.grad_bytes_per_param gives 4
                       master_bytes_per_param=0.0, params_are_master=False,
                       # logits and their log-softmax, 2 x fp32 per element
                       logits_bytes_per_element=2 * FP32_BYTES)
    if device == CPU_DEVICE:
        changes.update(allocator_fragmentation=0.0)
    if not changes:
        return calib
    return calib.replace_fields(source=f"{calib.source}; runtime storage ({device}, {precision.value})",
                                **changes)
