"""FSDP2's backward buffers on a small plan, dry run against the cost model (docs/dryrun.md, session 13).

``PYTHONPATH=src python bench/dryrun_fsdp_buffers.py [--layers 8] [--vocab 32000]`` (about 15 s):
Llama-3-8B shapes with few layers, FSDP (ZeRO-3) over one 8-GPU H100 node, seq 4,096, 2 micro-batches,
rank 0 run by ``meshplan train --dry-run --simulate``. Prints the tracked peak, the model's tensors
and the four-part split of bench/dryrun_report.py, and the origins that are FSDP's: the root unit's
gathered weights, the LM head's 16-bit gradient, the reduce-scatter input, the gathered layers.
With the full vocabulary (``--layers 4 --vocab 128256``) the peak falls in the loss's backward instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dryrun_report import dry_parts, model_parts

GIB = 2**30


def write_plan(path: Path, layers: int, vocab: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "plan.json"
        subprocess.run([sys.executable, "-m", "meshplan", "plan", "--model", "llama3-8b", "--gpu", "h100-sxm",
                        "--gpus", "8", "--seq-len", "4096", "--global-batch", "16", "--out", str(base)],
                       check=True, capture_output=True)
        d = json.loads(base.read_text())
    d["model"].update(name=f"llama3-8b-{layers}l-v{vocab}", num_layers=layers, vocab_size=vocab)
    d["plan"].update(dims=dict(dp_replicate=1, dp_shard=8, tp=1, pp=1, cp=1, ep=1, etp=0), zero=3, sp=False,
                     stage_layers=[layers], micro_batch=1, recompute="none", recompute_layers=[0], offload=[],
                     offload_layers=0, keep_gathered=[], mlp_splits=1, head_splits=1, schedule="1f1b", vpp=1)
    path.write_text(json.dumps(d, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "small.json"
        write_plan(plan, args.layers, args.vocab)
        out = subprocess.run([sys.executable, "-m", "meshplan", "train", "--plan", str(plan), "--dry-run",
                              "--simulate", "--ranks", "0", "--json"], check=True, capture_output=True,
                             text=True, env=os.environ).stdout
    r = json.loads(out)["ranks"][0]
    dry, model = r["dry_run"], r["cost_model_memory"]
    print(f"peak {dry['peak_bytes'] / GIB:.2f} GiB at {dry['peak_at']}; model tensors "
          f"{model['tensor_bytes'] / GIB:.2f} GiB ({dry['peak_bytes'] / model['tensor_bytes'] - 1:+.1%})")
    d, m = dry_parts(dry), model_parts(model)
    for part in d:
        print(f"  {part:12s} dry {d[part] / GIB:6.2f}  model {m[part] / GIB:6.2f}")
    for o in dry.get("peak_origins", []):
        fsdp = o["op"] == "aten.empty.memory_format" or (o["category"] == "Gradient" and o["module"].endswith(".output"))
        if fsdp:
            print(f"  {o['bytes'] / GIB:6.3f} GiB  {o['category']:9s} {o['module']} {o['op']} {o['dtype']}")


if __name__ == "__main__":
    main()
