"""What this runtime can execute: refuse a plan with a clear reason before any process starts.

Pure Python (no torch), so ``meshplan train`` checks a plan before it launches torchrun.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.plan import CPMethod, Job
from meshplan.spec.model import Arch


def check_runnable(job: Job, pipeline_available: bool) -> None:
    """Raise MeshplanError naming the first thing in ``job`` this runtime cannot run."""
    model, plan, d = job.model, job.plan, job.plan.dims
    if model.arch != Arch.DECODER:
        raise MeshplanError(f"the runtime trains decoder models only; {model.name} is an {model.arch.value}")
    if d.pp > 1 and not pipeline_available:
        raise MeshplanError("pipeline parallel (pp > 1) is not available in this build of the runtime")
    if d.pp > 1:
        from meshplan.runtime.pipeline_check import check_pipeline_plan

        check_pipeline_plan(model, job.training, plan)
    if d.cp > 1 and plan.cp_method == CPMethod.RING:
        raise MeshplanError(
            "ring context parallel is not implemented by this runtime; use cp_method 'all-to-all' "
            "(Ulysses), which runs on CPU and GPU"
        )
    if job.training.seq_len > model.max_position and model.position.value == "learned":
        raise MeshplanError(f"seq_len={job.training.seq_len} exceeds max_position={model.max_position}")
    if model.is_moe and d.tp > 1:
        raise MeshplanError(
            "MoE with tensor parallel (expert tensor parallel) is not supported by this runtime; "
            "use ep over dp_shard*cp instead of tp"
        )
    if d.tp > 1 and model.num_kv_heads % d.tp:
        raise MeshplanError(
            f"tp={d.tp} exceeds num_kv_heads={model.num_kv_heads}: replicating KV heads across "
            "tensor-parallel ranks is not supported by this runtime"
        )
    if d.tp > 1 and model.vocab_size % d.tp:
        raise MeshplanError(f"vocab_size={model.vocab_size} is not divisible by tp={d.tp}")
