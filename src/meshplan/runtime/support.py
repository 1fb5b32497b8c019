"""What this runtime can execute: refuse a plan with a clear reason before any process starts.

Pure Python (no torch), so ``meshplan train`` checks a plan before it launches torchrun.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.spec.model import Arch


BYTE_VOCAB = 256
"""The byte-level tokenizer of ``--data`` needs token ids 0..255."""


def check_runnable(job: Job, pipeline_available: bool, text_data: bool = False) -> None:
    """Raise MeshplanError naming the first thing in ``job`` this runtime cannot run."""
    model, plan, d = job.model, job.plan, job.plan.dims
    if text_data and model.vocab_size < BYTE_VOCAB:
        raise MeshplanError(f"--data needs vocab_size >= {BYTE_VOCAB} (byte tokenizer), "
                            f"{model.name} has {model.vocab_size}")
    if model.arch != Arch.DECODER:
        raise MeshplanError(f"the runtime trains decoder models only; {model.name} is an {model.arch.value}")
    _check_architecture(model, plan)
    if d.pp > 1 and not pipeline_available:
        raise MeshplanError("pipeline parallel (pp > 1) is not available in this build of the runtime")
    if d.pp > 1:
        from meshplan.runtime.pipeline_check import check_pipeline_plan

        check_pipeline_plan(model, job.training, plan)
    if job.training.seq_len > model.max_position and model.position.value == "learned":
        raise MeshplanError(f"seq_len={job.training.seq_len} exceeds max_position={model.max_position}")
    if model.is_moe and d.tp > 1 and plan.sp:
        raise MeshplanError(
            "MoE with tensor + sequence parallel is not supported by this runtime (its experts "
            "need the whole sequence on every tp rank); use tp without sp, or ep over dp_shard*cp"
        )
    if d.tp > 1 and model.vocab_size % d.tp:
        raise MeshplanError(f"vocab_size={model.vocab_size} is not divisible by tp={d.tp}")


def _check_architecture(model, plan) -> None:
    """Layouts the planner models but this runtime's reference models do not build (yet)."""
    unsupported = (
        (model.is_hybrid, "hybrid Mamba-2 layers (hybrid_pattern)"),
        (model.sliding_window > 0, "sliding-window attention"),
        (model.attention_sinks, "attention sinks"),
        (model.mtp_num_layers > 0, "multi-token prediction (mtp_num_layers)"),
        (model.moe_latent_size > 0, "LatentMoE (moe_latent_size)"),
    )
    for present, feature in unsupported:
        if present:
            raise MeshplanError(f"{model.name}: {feature} is planner-only; the runtime cannot train it")
    if model.is_mla and plan.sp:
        raise MeshplanError("multi-head latent attention with sequence parallel is not supported by "
                            "this runtime; use tp without sp")
