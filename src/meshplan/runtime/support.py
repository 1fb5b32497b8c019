"""What this runtime can execute: refuse a plan with a clear reason before any process starts.

Pure Python (no torch), so ``meshplan train`` checks a plan before it launches torchrun.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.targets import Target, check_runs


BYTE_VOCAB = 256
"""The byte-level tokenizer of ``--data`` needs token ids 0..255."""
MAX_RUNTIME_LAYERS = 1024
"""Layers this runtime builds: every rank builds the whole model's module list before cutting its
stage (runtime/models, runtime/pipeline.build_pipeline), about 3 ms a layer on the meta device on
this 2-core host before any parallelization (1024 toy layers 3.3 s, 4096 12 s; 10^5 ran for
minutes and 10^8 never finished). The deepest published stacks have a few hundred layers."""


def check_runnable(job: Job, text_data: bool = False) -> None:
    """Raise MeshplanError naming the first thing in ``job`` this runtime cannot run."""
    model, plan, d = job.model, job.plan, job.plan.dims
    if model.num_layers > MAX_RUNTIME_LAYERS:
        raise MeshplanError(f"{model.name}: {model.num_layers:,} layers; this runtime builds every layer's module "
                            f"on every rank and takes at most {MAX_RUNTIME_LAYERS:,}")
    if text_data and model.vocab_size < BYTE_VOCAB:
        raise MeshplanError(f"--data needs vocab_size >= {BYTE_VOCAB} (byte tokenizer), "
                            f"{model.name} has {model.vocab_size}")
    if d.pp > 1:
        from meshplan.runtime.pipeline_check import stage_layer_ranges

        stage_layer_ranges(plan, model.num_layers)  # the split must cover the model exactly
    check_runs(Target.MESHPLAN, model, job.training, plan)  # the rules the search applies too
