"""Tiny jobs shared by the runtime tests (2 layers, seq 16, batch 8: seconds per run on 2 cores)."""

from __future__ import annotations

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Optimizer, TrainingSpec

SEQ_LEN = 16
GLOBAL_BATCH = 8
STEPS = 5
LR = 0.3
"""SGD with momentum: AdamW would turn the ~1e-9 rounding noise of gradients that are exactly zero
in theory (e.g. the key bias, which softmax cancels) into lr-sized steps of random sign."""
MODELS = {
    "llama": model_preset("toy-llama").with_overrides({"num_layers": 2}),  # RMSNorm, RoPE, GQA 4q/2kv, SwiGLU
    "gpt": model_preset("toy-gpt").with_overrides({"num_layers": 2}),  # LayerNorm, learned pos, biases, tied
    "moe": model_preset("toy-moe").with_overrides({"num_layers": 2}),  # 4 experts, top-2
    # MLA (q and kv low rank, rope 8 + nope 16, v 16), layer 0 dense, layer 1 MoE + 1 shared expert
    "mla": model_preset("toy-mla").with_overrides({"num_layers": 2}),
    "qknorm": model_preset("toy-llama").with_overrides({"num_layers": 2, "qk_norm": "true"}),  # Qwen3-style
}


def make_job(model: str, optimizer: Optimizer = Optimizer.SGD, **plan_fields) -> Job:
    dims = ParallelDims(**plan_fields.pop("dims", {}))
    plan = Plan(dims=dims, **plan_fields)
    return Job(model=MODELS[model], training=TrainingSpec(seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH,
                                                          optimizer=optimizer),
               cluster=resolve_cluster("cpu", gpus=dims.world_size), plan=plan)
