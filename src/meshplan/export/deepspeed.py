"""Job -> DeepSpeed config JSON.

Key names checked against DeepSpeed's config documentation (docs/_pages/config-json.md: batch
sizes, ``zero_optimization.stage``, ``bf16``/``fp16``, ``activation_checkpointing``;
``tensor_parallel.autotp_size`` for AutoTP training).
What DeepSpeed sets in model code rather than in the JSON (pipeline stages through
``PipelineModule(num_stages=...)``, MoE ``ep_size``, which layers call
``deepspeed.checkpointing.checkpoint``) is stated as a warning; what it cannot run is refused.
Checked by DeepSpeed's own config class (tests/frameworks/test_deepspeed_parses.py, 0.19.8).
"""

from __future__ import annotations

import json

from meshplan.errors import MeshplanError
from meshplan.export.base import (Export, ExportTarget, refuse_data_schedule, refuse_expert_placement,
                                  refuse_moe_routing, refuse_recompute_modules, uniform_recompute)
from meshplan.export.osdp import persistence_config
from meshplan.plan import Job, Offload, Recompute, Schedule
from meshplan.spec.training import Precision


def deepspeed_config(job: Job) -> tuple[dict[str, object], list[str]]:
    plan = job.full_plan
    d, t = plan.dims, job.training
    warnings: list[str] = []
    if d.cp > 1:
        raise MeshplanError("DeepSpeed's config cannot express context parallel (cp > 1); "
                            "DeepSpeed-Ulysses is set up in model code")
    if t.precision in (Precision.FP8, Precision.FP4):
        raise MeshplanError(f"DeepSpeed's config has no {t.precision.value} training switch (it needs "
                            "Transformer Engine in model code); use bf16 or fp16")
    cfg: dict[str, object] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_microbatches(t),
    }
    if t.precision == Precision.BF16:
        cfg["bf16"] = {"enabled": True}
    elif t.precision == Precision.FP16:
        cfg["fp16"] = {"enabled": True}
    if plan.zero and d.dp_shard == 1 and d.dp_replicate > 1:
        # DeepSpeed ZeRO partitions over the whole data-parallel group: it has no replicas of a
        # one-rank partition; over a single data-parallel rank the stage is as planned (ZeRO-Offload)
        raise MeshplanError(f"DeepSpeed ZeRO shards over every data-parallel rank: zero {plan.zero} over dp_shard 1 "
                            f"with {d.dp_replicate} replicas is not expressible; plan zero 0 or dp_shard {d.dp}")
    zero: dict[str, object] = {"stage": plan.zero}
    if d.dp_shard > 1 and d.dp_replicate > 1:
        # its one hybrid form, MiCS (mics_shard_size), was removed: DeepSpeedConfig rejects the
        # key since 0.19 (deepspeed/runtime/config.py _REMOVED_ZERO_CONFIG_KEYS, issue 8489)
        raise MeshplanError(
            f"DeepSpeed ZeRO shards over every data-parallel rank; hybrid sharding "
            f"(dp_replicate={d.dp_replicate} x dp_shard={d.dp_shard}) was MiCS, which DeepSpeed 0.19 removed"
        )
    refuse_expert_placement(plan, "DeepSpeed")
    if plan.vocab_parallel:
        raise MeshplanError("DeepSpeed has no vocabulary parallelism over pipeline ranks; plan without --vocab-parallel")
    zero.update(_offload_config(plan, zero["stage"]))
    zero.update(persistence_config(job.model, plan))
    cfg["zero_optimization"] = zero
    if d.tp > 1:
        if plan.zero == 3:
            raise MeshplanError("DeepSpeed AutoTP training works with ZeRO stages 0-2, not 3")
        cfg["tensor_parallel"] = {"autotp_size": d.tp}
        warnings.append("tp mapped to DeepSpeed AutoTP training (DeepSpeed >= 0.16.4, Hugging Face "
                        "models); it has no Megatron-style tuned kernels")
        if plan.sp:
            warnings.append("AutoTP has no sequence parallel: activations are not split over tp "
                            "(more activation memory than planned)")
    if d.pp > 1:
        if plan.schedule != Schedule.ONE_F_ONE_B:
            raise MeshplanError(f"DeepSpeed's pipeline engine runs 1F1B only, not {plan.schedule.value!r}")
        if plan.zero >= 2:
            raise MeshplanError("DeepSpeed's pipeline engine supports ZeRO stages 0 and 1 only")
        warnings.append(
            f"pipeline degree is set in code: PipelineModule(layers, num_stages={d.pp}); "
            f"layers per stage {list(plan.stage_layers)} (partition_method='uniform' gives an even split)"
        )
    if d.etp and d.etp != d.tp:
        raise MeshplanError("DeepSpeed-MoE has no expert tensor parallel of its own (etp must equal tp)")
    # deepspeed/moe/layer.py@639460a: MoE(..., ep_size=1, capacity_factor=1.0, drop_tokens=True):
    # tokens move by all-to-all (sharded_moe.py), padded to capacity where they are dropped
    refuse_moe_routing(job, "DeepSpeed-MoE", dispatchers=("alltoall",), drops_tokens=True)
    refuse_data_schedule(job, "DeepSpeed")
    if job.model.is_moe:
        cf = t.moe_capacity_factor
        routing = "drop_tokens=False" if cf is None else f"capacity_factor={cf:g}, drop_tokens=True"
        warnings.append(f"MoE layers are set in code: deepspeed.moe.layer.MoE(..., ep_size={d.ep}, {routing})")
    refuse_recompute_modules(plan, "DeepSpeed")
    if plan.recompute == Recompute.SELECTIVE:
        raise MeshplanError("DeepSpeed checkpoints whole layers; selective (attention-core) "
                            "recompute is not expressible: use full")
    if plan.recompute == Recompute.FULL:
        every, _ = uniform_recompute(plan)
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": sum(plan.recompute_layers),
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
        which = "every layer" if every else f"{list(plan.recompute_layers)} layers per stage"
        warnings.append(f"activation checkpointing runs where the model calls "
                        f"deepspeed.checkpointing.checkpoint: wrap {which}")
    return cfg, warnings


def _offload_config(plan, stage) -> dict[str, object]:
    """ZeRO-Offload (``offload_optimizer``, stages 1-3) and ZeRO-Infinity's parameter offload
    (``offload_param``, stage 3) to host memory; activations: not expressible (its
    ``cpu_checkpointing`` needs partitioned activations over model parallel ranks)."""
    if not plan.offload:
        return {}
    if Offload.ACTIVATIONS in plan.offload:
        raise MeshplanError("DeepSpeed offloads activations only as partitioned checkpoints "
                            "(cpu_checkpointing with partition_activations); not exported")
    if not stage:
        raise MeshplanError("DeepSpeed's offload_optimizer needs ZeRO stage 1-3; the plan has zero 0")
    out: dict[str, object] = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if Offload.PARAMS in plan.offload:
        out["offload_param"] = {"device": "cpu", "pin_memory": True}
    return out


def export_deepspeed(job: Job) -> Export:
    cfg, warnings = deepspeed_config(job)
    return Export(ExportTarget.DEEPSPEED, json.dumps(cfg, indent=2) + "\n", tuple(warnings))
