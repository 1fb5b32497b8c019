"""`meshplan models` and `meshplan clusters`: list the presets."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
import yaml
from rich.table import Table

from meshplan.cli.common import JsonOpt, console, print_json
from meshplan.cli.main import app
from meshplan.spec.cluster import ClusterSpec, example_cluster_yaml, gpu_names, gpu_preset, system_names, system_preset
from meshplan.spec.presets import model_names, model_preset


@app.command("models")
def models(json_out: JsonOpt = False) -> None:
    """List the model presets with their sizes."""
    rows = []
    for name in model_names():
        m = model_preset(name)
        rows.append({
            "name": name, "arch": m.arch.value, "params": m.num_params(),
            "active_params": m.num_params(active_only=True), "layers": m.num_layers,
            "hidden": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
            "ffn": m.ffn_hidden_size, "vocab": m.vocab_size, "experts": m.moe_num_experts,
        })
    if json_out:
        print_json(rows)
        return
    t = Table(title="Model presets")
    for col in ("name", "params", "active", "L", "D", "heads", "kv", "FFN", "vocab", "experts"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        t.add_row(r["name"], _count(r["params"]), _count(r["active_params"]), str(r["layers"]),
                  str(r["hidden"]), str(r["heads"]), str(r["kv_heads"]), str(r["ffn"]),
                  str(r["vocab"]), str(r["experts"] or ""))
    console().print(t)


@app.command("clusters")
def clusters(
    example: Annotated[bool, typer.Option("--example", help="Print a commented example cluster file (YAML) to start your own from.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List the GPU and system presets."""
    if example:
        text = example_cluster_yaml()
        if json_out:
            print_json({"yaml": text, "cluster": ClusterSpec.from_dict(yaml.safe_load(text)).to_dict()})
        else:
            sys.stdout.write(text)
        return
    gpus = [gpu_preset(n) for n in gpu_names()]
    systems = [system_preset(n) for n in system_names()]
    if json_out:
        print_json({"gpus": [g.__dict__ for g in gpus], "systems": [s.to_dict() for s in systems]})
        return
    t = Table(title="GPU presets")
    for col in ("gpu", "fp32 TFLOP/s", "fp16 TFLOP/s", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp4 TFLOP/s", "memory GiB",
                "HBM TB/s"):
        t.add_column(col, justify="left" if col == "gpu" else "right")
    for g in gpus:
        # a precision the GPU has no rate for is blank, not 0 (V100: fp16 only; CPU: fp32 only)
        rates = (g.peak_fp32_flops, g.peak_fp16_flops, g.peak_bf16_flops, g.peak_fp8_flops, g.peak_fp4_flops)
        t.add_row(g.name, *(f"{r / 1e12:.{1 if r < 1e14 else 0}f}" if r else "" for r in rates),
                  f"{g.memory_gib:.1f}", f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}")
    console().print(t)
    s = Table(title="System presets (per-GPU link bandwidth, one direction)")
    for col in ("system", "gpu", "GPUs/node", "NVLink domain", "intra GB/s", "inter GB/s"):
        s.add_column(col, justify="left" if col in ("system", "gpu") else "right")
    for c in systems:
        s.add_row(c.name, c.gpu.name, str(c.gpus_per_node), str(c.scale_up_gpus),
                  f"{c.intra_node_bandwidth_bytes_per_s / 1e9:.0f}",
                  f"{c.inter_node_bandwidth_bytes_per_s / 1e9:.1f}")
    console().print(s)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
