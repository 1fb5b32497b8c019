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


def layout_runs(layouts: dict, tmp_path_factory, tag: str) -> dict:
    """Train each named layout ``{name: (model, make_job fields)}`` and, once per model, its
    single-process reference; ``{name: (result, reference)}`` for the parity tests."""
    from meshplan.runtime.testing import run_jobs, single_process

    jobs = [make_job(model, **dict(fields)) for model, fields in layouts.values()]
    models = sorted({model for model, _ in layouts.values()})
    refs = run_jobs([single_process(make_job(m)) for m in models], steps=STEPS, lr=LR,
                    tmp_path=tmp_path_factory.mktemp("ref"))
    results = run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path_factory.mktemp(tag))
    ref_of = dict(zip(models, refs))
    return {name: (got, ref_of[layouts[name][0]]) for name, got in zip(layouts, results)}
