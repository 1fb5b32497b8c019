"""`meshplan profile`: measure the local devices and write a hardware profile JSON."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import JsonOpt, console, err_console, print_json, path_value
from meshplan.cli.checks import count_flag, output_path, refuse_with
from meshplan.cli.main import app
from meshplan.errors import MeshplanError

log = logging.getLogger(__name__)


@app.command("profile")
def profile(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", parser=path_value, help="Where to write the profile JSON.")] = Path("profile.json"),
    procs: Annotated[Optional[int], typer.Option("--procs", help="Processes for the collective benchmarks "
                                                  "(group sizes 2..N; default 4 on CPU, all GPUs on CUDA; 1 skips them).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer shapes and sizes (under a minute on a CPU).")] = False,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    show: Annotated[Optional[Path], typer.Option("--show", parser=path_value, help="Check and print an existing profile instead of measuring.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure matmul, attention, memory bandwidth and collectives; write a profile for --cluster-profile."""
    if show is not None:
        from meshplan.calib.hwprofile import load_profile

        refuse_with(ctx, ("out", "procs", "quick", "device"), because="--show prints a profile, it measures nothing")
        loaded = load_profile(show)
        if json_out:
            print_json(loaded.to_dict())
        else:
            _render(loaded, None)
        return
    if device not in ("auto", "cpu", "cuda"):
        raise MeshplanError(f"--device must be auto, cpu or cuda, got {device!r}")
    count_flag("--procs", procs)
    output_path(out, "--out", "hardware profile")
    try:
        from meshplan.profile.run import (ProfileRequest, default_procs, planned_steps, resolve_device_type,
                                          run_profile)
    except ImportError as exc:
        raise MeshplanError(f"meshplan profile needs torch ({exc})") from None
    device_type = resolve_device_type(device)
    cores = os.cpu_count() or 1
    if procs is not None and device_type == "cpu" and procs > cores:
        log.warning("--procs %d is more than this machine's %d cores: the collective benchmarks will "
                    "share the cores, run slowly and measure that contention more than the links", procs, cores)
    req = ProfileRequest(procs=procs or default_procs(device_type), quick=quick, device_type=device_type)
    with Progress(TextColumn("[bold]profile[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console(),
                  transient=json_out) as bar:
        task = bar.add_task("starting", total=planned_steps(req))
        result = run_profile(req, lambda label: bar.update(task, advance=1, description=label))
    data = result.to_dict()
    out.write_text(json.dumps(data, indent=1) + "\n")
    if json_out:
        print_json(data)
        return
    _render(result, out)


def _render(p, out: Path | None) -> None:
    con = console()
    t = Table(title=f"Hardware profile: {p.device.name} ({p.meta.device_type}, torch {p.meta.torch_version})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for prec, v in sorted(p.peak_flops.items()):
        t.add_row(f"best matmul {prec}", f"{v / 1e12:.3f} TFLOP/s")
    for a in p.attention:
        bwd = f", backward {a.backward_s / a.time_s:.2f}x" if a.backward_s > 0 else ""
        t.add_row(f"causal SDPA {a.precision} B={a.batch} N={a.heads} S={a.seq_len} H={a.head_dim}",
                  f"{a.flops_per_s / 1e12:.3f} TFLOP/s{bwd}")
    t.add_row("memory bandwidth (best)", f"{p.device.hbm_bandwidth_bytes_per_s / 1e9:.1f} GB/s")
    t.add_row("memory capacity", f"{p.device.memory_gib:.1f} GiB")
    t.add_row("framework baseline (worker RSS)", f"{p.device.framework_baseline_bytes / 2**20:.0f} MiB")
    if p.device.host_s_per_kernel > 0:
        t.add_row("host time per eager kernel", f"{p.device.host_s_per_kernel * 1e6:.1f} us")
    for c in p.concurrent:
        t.add_row(f"matmul per process, {c.group_size} at once", f"{c.flops_per_s_per_process / 1e9:.1f} GFLOP/s")
    if p.link_bandwidth_bytes_per_s is not None:
        t.add_row("link (all collectives) alpha", f"{p.link_latency_s * 1e6:.1f} us")
        t.add_row("link (all collectives) bus bandwidth", f"{p.link_bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    con.print(t)
    if p.collective_fits:
        c = Table(title=f"Collectives ({p.meta.backend}): t = alpha + bus_bytes / W")
        for col in ("op", "ranks", "alpha us", "W GB/s", "max fit err"):
            c.add_column(col, justify="left" if col == "op" else "right")
        for f in p.collective_fits:
            c.add_row(f.op, str(f.group_size), f"{f.latency_s * 1e6:.1f}", f"{f.bandwidth_bytes_per_s / 1e9:.2f}",
                      f"{f.max_rel_error:.0%}")
        con.print(c)
    if p.layer_probes:
        _render_probes(p, con)
    if out is not None:
        con.print(f"wrote {out}")


def _render_probes(p, con) -> None:
    """The layer probe's times and the per-layer overheads fitted from them."""
    from meshplan.calib.hwcalib import calibration_from_profile_data, probe_table
    from meshplan.spec.training import Precision

    calib = calibration_from_profile_data(p, "shown", Precision.FP32)[0]
    t = Table(title="Layer probe: the runtime's own path, per extra layer (forward + backward)")
    for col in ("parallelism", "ranks", "measured ms", "formulas ms", "overhead ms per extra rank"):
        t.add_column(col, justify="left" if col == "parallelism" else "right")
    for kind, ranks, measured, modeled, overhead in probe_table(p, calib):
        t.add_row(kind, str(ranks), f"{measured * 1e3:.2f}", f"{modeled * 1e3:.2f}", f"{overhead * 1e3:.2f}")
    con.print(t)
