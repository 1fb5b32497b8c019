"""The cost model's Calibration fitted from a hardware profile (no torch).

``hwprofile.apply_profile_data`` already puts the measured rates into the ClusterSpec (peak = best matmul seen,
HBM bandwidth = best copy/elementwise bandwidth, link = alpha-beta fit over all collectives), so
the factors fitted here are relative to those measured rates:

  matmul_efficiency, matmul_half_dim   the curve eff_max * x / (x + x_half) fitted to the matmul
                                       sweep (x = smallest GEMM dimension), relative to the best;
  attention_efficiency,                causal SDPA FLOP/s over (peak * H / (H + x_half)), the form
  attention_half_head_dim              in which the cost model uses it, median over shapes, with
                                       the matmul curve's x_half as the head-dim falloff;
  hbm_efficiency                       elementwise-add bandwidth over the best bandwidth (the
                                       memory-bound ops of a layer are elementwise, not copies);
  intra_node_comm_efficiency           1: the link bandwidth already is the measured bus bandwidth;
  framework_overhead_gib               CPU only: resident memory of a torch worker that has joined
                                       its process group (on GPU the CUDA context is outside
                                       max_memory_allocated, so the default stays);
  <op>_latency_factor,                 each collective's own alpha-beta fit (per ring step, the
  <op>_bandwidth_factor                cost model's convention) over the joint link line, median
                                       over the group sizes measured;
  elementwise_time_factor              CPU only: the elementwise probe (the runtime's norms,
                                       residuals, SwiGLU, rotary embedding, GQA repeat, forward +
                                       backward) over the cost model's memory-bound time for it;
  host_s_per_kernel                    CUDA only: the host probe (forward + backward of a chain of
                                       tiny eager ops: the host's issue time per kernel, which
                                       cost/host.py bounds a layer by); on a CPU device the
                                       dispatch already is device time (layer_overhead_s);
  <kind>_layer_overhead_s              CPU only: the layer probe (meshplan.calib.layer_probe): the
                                       runtime's measured time per extra layer under each
                                       parallelism less what the cost model, with every factor
                                       above, predicts for the same probe job; fitted in the
                                       order dp, fsdp, tp, cp so each residual is net of
                                       the overheads already fitted.

Every fitted value is returned in a ``FittedValue`` with its source ``profile:<file>:<date>``;
the Calibration's ``source`` names the profile and the fields it changed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan.calib.hwfit import CollectiveOp, fit_matmul_curve, fit_seq_falloff
from meshplan.calib.hwprofile import HardwareProfile, apply_profile_data, load_profile, profile_source
from meshplan.cost.calibration import Calibration
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.spec.cluster import GIB
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec


CPU_SERIAL_OVERLAPS = ("tp_overlap", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap", "pp_p2p_overlap")


@dataclass(frozen=True, kw_only=True)
class FittedValue:
    field: str
    value: float
    source: str
    how: str


def profile_fit(profile: HardwareProfile, source: str, precision: Precision) -> tuple[FittedValue, ...]:
    """The Calibration fields a profile determines, for matmuls in ``precision``."""
    prec = precision.value
    samples = [s for s in profile.matmul if s.precision == prec]
    if len(samples) < 2:
        measured = ", ".join(sorted(profile.peak_flops)) or "none"
        raise MeshplanError(f"profile has no {prec} matmul sweep (measured: {measured})")
    best = profile.peak_flops[prec]
    curve = fit_matmul_curve([(s.m, s.n, s.k) for s in samples], [s.flops_per_s for s in samples], best)
    eff_max = min(1.0, curve.eff_max)
    out = [
        FittedValue(field="matmul_efficiency", value=eff_max, source=source,
                    how=f"curve fit over {len(samples)} {prec} shapes, relative to the best "
                        f"({best / 1e12:.4g} TFLOP/s); max fit error {curve.max_rel_error:.0%}"),
        FittedValue(field="matmul_half_dim", value=curve.d_half, source=source,
                    how="same curve: smallest GEMM dimension at half of matmul_efficiency"),
    ]
    attn = [a for a in profile.attention if a.precision == prec]
    if _attention_sweep(attn):
        out += _attention_fit(attn, best, curve.d_half, source)
    elif attn:
        effs = [a.flops_per_s / (best * a.head_dim / (a.head_dim + curve.d_half)) for a in attn]
        out.append(FittedValue(field="attention_efficiency", value=min(1.0, statistics.median(effs)),
                               source=source, how=f"causal SDPA, median over {len(attn)} shapes"))
    if attn:
        # the profile's SDPA runs as matmuls of the measured curve: its head-dim falloff is theirs
        out.append(FittedValue(field="attention_half_head_dim", value=curve.d_half, source=source,
                               how="the matmul curve's half dimension (SDPA measured against it)"))
    adds = [b.bytes_per_s for b in profile.bandwidth if b.op == "add"]
    if adds:
        out.append(FittedValue(field="hbm_efficiency",
                               value=min(1.0, max(adds) / profile.device.hbm_bandwidth_bytes_per_s),
                               source=source, how="elementwise add over the best measured bandwidth"))
    if profile.link_bandwidth_bytes_per_s is not None:
        out.append(FittedValue(field="intra_node_comm_efficiency", value=1.0, source=source,
                               how="link bandwidth is the measured bus bandwidth of the collectives"))
    if profile.device.layer_overhead_s > 0:
        out.append(FittedValue(field="layer_overhead_s", value=profile.device.layer_overhead_s,
                               source=source, how="forward+backward of 5 vs 1 tiny reference layers, / 4 / 3"))
    if profile.meta.device_type == "cuda" and profile.device.host_s_per_kernel > 0:
        # on a CPU device the dispatch is device time already (layer_overhead_s; cost/host.py
        # charges no host bound there): the figure is recorded in the profile, not applied
        out.append(FittedValue(field="host_s_per_kernel", value=profile.device.host_s_per_kernel, source=source,
                               how="forward+backward of a chain of 40 vs 8 tiny muls, per kernel"))
    out += _collective_factors(profile, source)
    if profile.meta.device_type == "cpu" and profile.device.elementwise_probe_s > 0:
        hbm = next((f.value for f in out if f.field == "hbm_efficiency"), Calibration().hbm_efficiency)
        out.append(_elementwise_fit(profile, source, hbm))
    if profile.meta.device_type == "cpu":
        # Every core runs a rank (meshplan train gives each CPU rank one thread): a collective's
        # progress (gloo's thread: copies, socket calls) takes the core the math would use.
        for name in CPU_SERIAL_OVERLAPS:
            out.append(FittedValue(field=name, value=0.0, source=source,
                                   how="CPU ranks: communication runs on the cores of the computation"))
        out.append(FittedValue(field="framework_overhead_gib",
                               value=profile.device.framework_baseline_bytes / GIB, source=source,
                               how="resident memory of a torch worker after joining its process group"))
    return tuple(out)


ATTENTION_SWEEP_MIN_LENGTHS = 3
"""Distinct sequence lengths with a measured backward needed to fit the sequence falloff (two
parameters per pass: at least one more point than unknowns)."""


def _attention_sweep(attn) -> bool:
    return len({a.seq_len for a in attn if a.backward_s > 0}) >= ATTENTION_SWEEP_MIN_LENGTHS


def _attention_fit(attn, best: float, half_dim: float, source: str) -> list[FittedValue]:
    """The causal attention core's forward and backward curves eff_max * S / (S + S_half) (the
    form of cost/mixers.attention_core_efficiency, relative to peak * H / (H + half_dim)), fitted
    as 1/eff linear in 1/S weighted to relative time (hwfit.fit_seq_falloff); the backward's
    efficiency counts twice the forward FLOPs, so
    attention_backward_ratio = 2 * eff_fwd / eff_bwd at large S."""
    rows = [a for a in attn if a.backward_s > 0]
    lens = [a.seq_len for a in rows]
    rate = [best * a.head_dim / (a.head_dim + half_dim) for a in rows]
    fwd = fit_seq_falloff(lens, [a.flops_per_s / r for a, r in zip(rows, rate)])
    # backward efficiency counted at twice the forward FLOPs (the 2x convention)
    bwd = fit_seq_falloff(lens, [2.0 * a.flops_per_s * a.time_s / a.backward_s / r for a, r in zip(rows, rate)])
    lengths = ", ".join(str(s) for s in sorted({a.seq_len for a in rows}))
    how = f"causal SDPA at S = {lengths}: curve fit, max fit error forward {fwd.max_rel_error:.0%}, " \
          f"backward {bwd.max_rel_error:.0%}"
    eff_fwd = min(1.0, fwd.eff_max)
    return [
        FittedValue(field="attention_efficiency", value=eff_fwd, source=source, how=how),
        FittedValue(field="attention_half_seq_causal", value=fwd.d_half, source=source,
                    how="same forward curve: KV length at half of attention_efficiency"),
        FittedValue(field="attention_backward_ratio", value=2.0 * eff_fwd / bwd.eff_max, source=source,
                    how="backward curve: 2 x forward efficiency / backward efficiency at large S"),
        FittedValue(field="attention_backward_half_seq_causal", value=bwd.d_half, source=source,
                    how="backward curve: KV length at half its large-S efficiency"),
    ]


def _elementwise_fit(profile: HardwareProfile, source: str, hbm_efficiency: float) -> FittedValue:
    """elementwise_time_factor: the probe's time over the cost model's memory-bound time for the
    same layer (its fwd compute with the factor at 1 less at 0, times 3 for forward + backward)."""
    from meshplan.cost.arrays import PlanArrays
    from meshplan.cost.layer import layer_cost
    from meshplan.spec.cluster import system_preset
    from meshplan.calib.layer_probe import ELEMENTWISE_PROBE, ELEMENTWISE_TOKENS, PROBE_MODEL

    model = model_preset(PROBE_MODEL).with_overrides({**ELEMENTWISE_PROBE, "num_layers": 1})
    training = TrainingSpec(seq_len=ELEMENTWISE_TOKENS, global_batch=1, precision=Precision.FP32)
    cluster = apply_profile_data(system_preset("cpu").with_gpus(1), profile)
    plans = PlanArrays.from_plans([Plan(micro_batch=1).with_defaults(model)])
    calib = Calibration(hbm_efficiency=hbm_efficiency)
    one, zero = (layer_cost(model, cluster, training, plans, calib.replace_fields(elementwise_time_factor=f))
                 for f in (1.0, 0.0))
    modeled = 3.0 * float(one.fwd_compute_s[0] - zero.fwd_compute_s[0])
    measured = profile.device.elementwise_probe_s
    return FittedValue(field="elementwise_time_factor", value=measured / modeled, source=source,
                       how=f"runtime's norms, residuals, SwiGLU, rotary, GQA repeat: {measured * 1e3:.2f} ms "
                           f"measured, {modeled * 1e3:.2f} ms of bytes / bandwidth")


def _ring_steps(op: CollectiveOp, n: int) -> float:
    """How many alphas the cost model charges one call (cost/comms.py)."""
    if op is CollectiveOp.SEND_RECV:
        return 1.0
    return (2.0 if op is CollectiveOp.ALL_REDUCE else 1.0) * (n - 1)  # tp_* ops: as all-gather / reduce-scatter


def _collective_factors(profile: HardwareProfile, source: str) -> list[FittedValue]:
    if profile.link_latency_s is None or not profile.collective_fits:
        return []
    out = []
    for op in CollectiveOp:
        fits = [f for f in profile.collective_fits if f.op == op.value]
        if not fits:
            continue
        sizes = ", ".join(str(f.group_size) for f in fits)
        bw = statistics.median(f.bandwidth_bytes_per_s for f in fits) / profile.link_bandwidth_bytes_per_s
        out.append(FittedValue(field=f"{op.value}_bandwidth_factor", value=bw, source=source,
                               how=f"{op.value} bus bandwidth over the joint link fit, median over {sizes} ranks"))
        if profile.link_latency_s > 0:
            alpha = statistics.median(f.latency_s / _ring_steps(op, f.group_size) for f in fits)
            out.append(FittedValue(field=f"{op.value}_latency_factor", value=alpha / profile.link_latency_s,
                                   source=source, how=f"{op.value} alpha per ring step over the joint link "
                                                      f"alpha, median over {sizes} ranks"))
    return out


def _probe_slopes(profile: HardwareProfile):
    """(kind, ranks, measured time per extra layer) for every probe kind the profile holds."""
    from meshplan.calib.layer_probe import PROBE_LAYERS, ProbeKind

    few, many = PROBE_LAYERS
    for kind in ProbeKind:
        rows = {p.layers: p for p in profile.layer_probes if p.kind == kind.value}
        if few in rows and many in rows:
            yield kind, rows[few].group_size, (rows[many].time_s - rows[few].time_s) / (many - few)


def _probe_fits(profile: HardwareProfile, source: str, calib: Calibration) -> list[FittedValue]:
    """Each parallelism's per-layer overhead (module docstring), given ``calib``: the measured
    time per extra layer less the modeled one (the kind's own field at 0), per extra rank."""
    out = []
    for kind, g, measured in _probe_slopes(profile):
        modeled, comm = _probe_model(profile, kind, g, calib)
        value = max(0.0, measured - modeled) / (g - 1)
        calib = calib.replace_fields(**{kind.overhead_field: value})
        out.append(FittedValue(field=kind.overhead_field, value=value, source=source,
                               how=f"layer probe over {g} processes: {measured * 1e3:.2f} ms per layer measured, "
                                   f"{modeled * 1e3:.2f} ms predicted without it ({comm * 1e3:.2f} ms of it collectives)"))
    return out


def probe_table(profile: HardwareProfile, calib: Calibration) -> list[tuple[str, int, float, float, float]]:
    """(kind, ranks, measured, modeled without the kind's overhead, overhead) per extra layer, in
    seconds, for a calibration fitted from ``profile`` (for ``meshplan profile --show``)."""
    return [(kind.value, g, measured,
             _probe_model(profile, kind, g, calib.replace_fields(**{kind.overhead_field: 0.0}))[0],
             getattr(calib, kind.overhead_field))
            for kind, g, measured in _probe_slopes(profile)]


def _probe_model(profile: HardwareProfile, kind, g: int, calib: Calibration) -> tuple[float, float]:
    """(modeled forward + backward time, modeled time of the kind's collectives), per extra layer."""
    from meshplan.cost import estimate
    from meshplan.spec.cluster import system_preset
    from meshplan.calib.hwprofile import apply_profile_data
    from meshplan.calib.layer_probe import PROBE_LAYERS, ProbeKind, probe_job, probe_plan

    plan = probe_plan(kind, g)
    cluster = apply_profile_data(system_preset("cpu").with_gpus(g), profile)
    few, many = PROBE_LAYERS
    ests = [estimate(*_job_parts(probe_job(plan, layers, cluster)), calib) for layers in (few, many)]
    # forward + backward only (the probe runs no optimizer step)
    step = [e.step_time_s - e.time.optimizer_s for e in ests]
    comm = [e.time.dp_comm_total_s if kind is ProbeKind.DP else e.time.microbatch_comm_total_s for e in ests]
    return (step[1] - step[0]) / (many - few), (comm[1] - comm[0]) / (many - few)


def _job_parts(job):
    return job.model, job.cluster, job.training, job.plan


def calibration_from_profile(path: str | Path, precision: Precision, base: Calibration | None = None,
                             ) -> tuple[Calibration, tuple[FittedValue, ...]]:
    """``base`` (default: Calibration()) with the profile's fitted fields, and what was fitted."""
    profile = load_profile(path)
    return calibration_from_profile_data(profile, profile_source(profile, path), precision, base)


def calibration_from_profile_data(profile: HardwareProfile, source: str, precision: Precision,
                                  base: Calibration | None = None,
                                  ) -> tuple[Calibration, tuple[FittedValue, ...]]:
    base = base or Calibration()
    fitted = profile_fit(profile, source, precision)
    if profile.meta.device_type == "cpu" and profile.layer_probes:
        # On a CPU the host is the device: its per-layer framework time is on the critical path
        # (on a GPU it hides behind the device's work, Calibration.tp_layer_overhead_s).
        fitted += tuple(_probe_fits(profile, source, base.replace_fields(**{f.field: f.value for f in fitted})))
    changes = {f.field: f.value for f in fitted}
    names = ", ".join(changes)
    calib = base.replace_fields(source=f"{source} ({names}); other fields: {base.source}", **changes)
    return calib, fitted


HOST_TIME_FIELDS = ("layer_overhead_s", "tp_layer_overhead_s", "cp_layer_overhead_s", "fsdp_layer_overhead_s",
                    "dp_layer_overhead_s")
"""Calibration fields that are host CPU time (dispatch, framework work around collectives)."""


def host_time_scaled(calib: Calibration, profile: HardwareProfile, num_procs: int) -> Calibration:
    """On a CPU, host time runs at the share of the cores a process gets: the overheads measured
    with 1 (layer_overhead_s) and PROBE_GROUP_SIZE processes take share(measured) / share(N) as
    long with N processes (4 ranks on 2 cores: about twice), and so do the collectives beyond
    what a pair of ranks measured. On a GPU the share is 1."""
    from meshplan.calib.hwprofile import host_share
    from meshplan.calib.layer_probe import PROBE_GROUP_SIZE

    if profile.meta.device_type != "cpu" or not profile.concurrent:
        return calib
    now = host_share(profile, num_procs).compute
    changes = {}
    for name in HOST_TIME_FIELDS:
        measured_with = 1 if name == "layer_overhead_s" else PROBE_GROUP_SIZE
        changes[name] = getattr(calib, name) * host_share(profile, measured_with).compute / now
    # gloo's collectives are host work too (copies, socket calls): measured while only the group's
    # ranks ran (mostly pairs), they slow down as much when more ranks share the cores.
    slower = max(1.0, host_share(profile, PROBE_GROUP_SIZE).compute / now)
    for op in CollectiveOp:
        changes[f"{op.value}_latency_factor"] = getattr(calib, f"{op.value}_latency_factor") * slower
        changes[f"{op.value}_bandwidth_factor"] = getattr(calib, f"{op.value}_bandwidth_factor") / slower
    return calib.replace_fields(**changes)
