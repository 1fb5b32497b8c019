"""Job -> Megatron-Bridge recipe + dotted overrides, and back.

Megatron-Bridge configures a run as a ``ConfigContainer`` built by a recipe function (e.g.
``megatron.bridge.recipes.llama.llama3.llama3_8b_pretrain_config``) and changed by Hydra-style
``section.field=value`` overrides (``megatron.bridge.training.utils.omegaconf_utils``:
``parse_hydra_overrides``). The plan's choices are the Megatron-LM export's (megatron.py, one
mapping for both forms), moved to the fields Megatron-LM copies them into: parallel degrees,
split, recompute and sequence parallel into ``model`` (a TransformerConfig), batch into ``train``,
the distributed optimizer into ``ddp``, FSDP2 into ``dist``, precision into a named
``mixed_precision`` recipe. Names read from the megatron-bridge 0.3.1 wheel (docs/interop.md).
The model's shape is the recipe's: a model with no recipe gets a RECIPE placeholder and a note.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.export.base import Export, ExportTarget
from meshplan.export.megatron import _model_args, megatron_args
from meshplan.launch_env import env_assignments
from meshplan.plan import Job
from meshplan.spec.model import ModelSpec

BRIDGE_VERSION = "0.3.1"
# meshplan preset -> recipe function (megatron/bridge/recipes/, 0.3.1)
RECIPES = {
    "llama3-8b": "megatron.bridge.recipes.llama.llama3:llama3_8b_pretrain_config",
    "llama3-70b": "megatron.bridge.recipes.llama.llama3:llama3_70b_pretrain_config",
    "llama3.1-405b": "megatron.bridge.recipes.llama.llama3:llama31_405b_pretrain_config",
    "qwen2.5-7b": "megatron.bridge.recipes.qwen.qwen2:qwen25_7b_pretrain_config",
    "qwen2.5-72b": "megatron.bridge.recipes.qwen.qwen2:qwen25_72b_pretrain_config",
}
PLACEHOLDER_RECIPE = "RECIPE"
# Megatron-LM flag -> Bridge field (Megatron-LM copies each into the same TransformerConfig /
# DistributedDataParallelConfig field; Bridge exposes those dataclasses under model. / ddp.)
FIELDS = {
    "--tensor-model-parallel-size": "model.tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "model.pipeline_model_parallel_size",
    "--context-parallel-size": "model.context_parallel_size",
    "--expert-model-parallel-size": "model.expert_model_parallel_size",
    "--cp-comm-type": "model.cp_comm_type",
    "--sequence-parallel": "model.sequence_parallel",
    "--decoder-first-pipeline-num-layers": "model.num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "model.num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "model.pipeline_model_parallel_layout",
    # TransformerConfig.account_for_*_in_pipeline_split (the Llama 3.1 405B recipe sets both)
    "--account-for-embedding-in-pipeline-split": "model.account_for_embedding_in_pipeline_split",
    "--account-for-loss-in-pipeline-split": "model.account_for_loss_in_pipeline_split",
    "--recompute-granularity": "model.recompute_granularity",
    "--recompute-method": "model.recompute_method",
    "--recompute-num-layers": "model.recompute_num_layers",
    "--micro-batch-size": "train.micro_batch_size",
    "--global-batch-size": "train.global_batch_size",
    "--seq-length": "model.seq_length",
    "--use-distributed-optimizer": "ddp.use_distributed_optimizer",
    "--num-distributed-optimizer-instances": "ddp.num_distributed_optimizer_instances",
    # DistributedDataParallelConfig; a recipe's CommOverlapConfig turns both on at dp > 1 itself
    # (training/comm_overlap.py _get_optimizer_overlap_cfgs), so the flags' absence is left to it
    "--overlap-grad-reduce": "ddp.overlap_grad_reduce",
    "--overlap-param-gather": "ddp.overlap_param_gather",
    "--use-torch-fsdp2": "dist.use_torch_fsdp2",
    "--optimizer-cpu-offload": "optimizer.optimizer_cpu_offload",  # megatron.core OptimizerConfig
    "--optimizer-offload-fraction": "optimizer.optimizer_offload_fraction",
    "--cpu-offloading": "model.cpu_offloading",  # TransformerConfig.cpu_offloading(_num_layers)
    "--cpu-offloading-num-layers": "model.cpu_offloading_num_layers",
    "--expert-tensor-parallel-size": "model.expert_tensor_parallel_size",
    "--moe-grouped-gemm": "model.moe_grouped_gemm",
    "--moe-token-dispatcher-type": "model.moe_token_dispatcher_type",  # TransformerConfig.moe_*
    "--moe-enable-deepep": "model.moe_enable_deepep",
    "--moe-expert-capacity-factor": "model.moe_expert_capacity_factor",
    "--moe-pad-expert-input-to-capacity": "model.moe_pad_expert_input_to_capacity",
}
MODULES_FLAG, MODULES_FIELD = "--recompute-modules", "model.recompute_modules"
"""A list flag (nargs='*'): written as a Hydra list; under selective recompute without it,
Megatron-Core's default [core_attn] (a recipe's own list would apply otherwise)."""
# written when the Megatron-LM export leaves the flag out, since a recipe sets its own (e.g. the
# Llama-3-8B recipe: context_parallel_size 2 and the distributed optimizer on)
ABSENT = {
    "--context-parallel-size": "1",
    "--expert-model-parallel-size": "1",
    "--sequence-parallel": "false",
    "--decoder-first-pipeline-num-layers": "null",
    "--decoder-last-pipeline-num-layers": "null",
    "--pipeline-model-parallel-layout": "null",
    "--account-for-embedding-in-pipeline-split": "false",
    "--account-for-loss-in-pipeline-split": "false",
    "--recompute-granularity": "null",
    "--recompute-method": "null",
    "--recompute-num-layers": "null",
    "--use-distributed-optimizer": "false",
    "--num-distributed-optimizer-instances": "1",
    "--use-torch-fsdp2": "false",
    "--cpu-offloading": "false",
}
MOE_ABSENT = {
    "--moe-enable-deepep": "false",
    "--moe-expert-capacity-factor": "null",
    "--moe-pad-expert-input-to-capacity": "false",
}
"""Written for an MoE model when the Megatron-LM export leaves the flag out (dropless, no DeepEP),
since an MoE recipe may set its own (a token-drop recipe sets a capacity factor)."""
VPP_FLAG, VPP_FIELD = "--num-layers-per-virtual-pipeline-stage", "model.virtual_pipeline_model_parallel_size"
DATASET_SEQ_FIELD = "dataset.sequence_length"
PRECISION_FIELD = "mixed_precision"
# Megatron-LM precision flags -> Bridge's registered recipe (training/mixed_precision.py); fp8
# 'hybrid' is Megatron-LM's default delayed-scaling recipe
PRECISIONS = {("--bf16",): "bf16_mixed", ("--fp16",): "fp16_mixed",
              ("--bf16", "--fp8-format"): "bf16_with_fp8_delayed_scaling_mixed"}
PRECISION_FLAGS = ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe")
SHAPE_FLAGS = ("--num-layers",)  # the recipe builds the model; only the layer count is needed here


def bridge_overrides(job: Job) -> tuple[list[tuple[str, str]], list[str]]:
    """(field, value) overrides of the recipe, and the warnings."""
    args, warnings = megatron_args(job)
    words = [w for a in args for w in a]
    flags = {w: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "true")
             for i, w in enumerate(words) if w.startswith("--")}
    _refuse_unmapped(job, flags)
    absent = {**ABSENT, **(MOE_ABSENT if job.model.is_moe else {})}
    out: list[tuple[str, str]] = []
    for flag, field in FIELDS.items():
        value = flags.get(flag, absent.get(flag))
        if value is not None:
            out.append((field, value))
    if flags.get("--recompute-granularity") == "selective":
        modules = next((a[1:] for a in args if a[0] == MODULES_FLAG), ["core_attn"])
        out.append((MODULES_FIELD, "[" + ",".join(modules) + "]"))
    if VPP_FLAG in flags:
        out.append((VPP_FIELD, str(job.full_plan.vpp)))  # (the flag's size counts the embedding / loss slots)
    elif "--pipeline-model-parallel-layout" not in flags:
        out.append((VPP_FIELD, "null"))
    out.append((DATASET_SEQ_FIELD, flags["--seq-length"]))
    if "--fp4-format" in flags or flags.get("--fp8-recipe", "delayed") != "delayed":
        recipe = flags.get("--fp4-recipe", flags.get("--fp8-recipe"))
        raise MeshplanError(f"Megatron-Bridge {BRIDGE_VERSION} registers the mixed_precision recipes "
                            f"{', '.join(PRECISIONS.values())} (training/mixed_precision.py), none for "
                            f"{job.training.precision.value} {recipe}: export to megatron, or plan fp8 delayed")
    key = tuple(f for f in ("--bf16", "--fp16", "--fp8-format") if f in flags)
    if key:
        out.append((PRECISION_FIELD, PRECISIONS[key]))
    else:
        out.append((PRECISION_FIELD, "null"))  # fp32
    return out, warnings


def _refuse_unmapped(job: Job, flags: dict[str, str]) -> None:
    """Every Megatron-LM argument of the plan has its override here, or is the model's shape (the
    recipe's) or its precision (a mixed_precision recipe): one the Bridge form would drop is refused."""
    shape = {a[0] for a in _model_args(job.model, job.training.seq_len, [])}
    known = {*FIELDS, VPP_FLAG, MODULES_FLAG, *PRECISION_FLAGS, *shape}
    dropped = sorted(f for f in flags if f not in known)
    if dropped:
        raise MeshplanError(f"the plan needs Megatron-LM's {', '.join(dropped)}, which this Megatron-Bridge "
                            "export has no override for: export to megatron")


def _value(v: str) -> str:
    # Hydra's grammar: '|' and '*' need a quoted string (pipeline layouts)
    return f'"{v}"' if any(c in v for c in '|*()') else v


def export_megatron_bridge(job: Job) -> Export:
    overrides, warnings = bridge_overrides(job)
    c = job.cluster
    recipe = RECIPES.get(job.model.name, PLACEHOLDER_RECIPE)
    lines = [f"# meshplan plan: {job.plan.notation()} on {c.num_gpus} GPUs ({c.num_nodes} nodes x {c.gpus_per_node})",
             f"# Megatron-Bridge {BRIDGE_VERSION}: build the recipe, then apply the overrides below "
             "(Hydra syntax: megatron.bridge.training.utils.omegaconf_utils.parse_hydra_overrides)",
             f"# job environment: {env_assignments()} (its launcher sets it only for the runs "
             "it names 'OOM if not set': scripts/performance/setup_experiment.py)"]
    if recipe == PLACEHOLDER_RECIPE:
        lines.append(f"# Megatron-Bridge {BRIDGE_VERSION} has no recipe for {job.model.name}: "
                     f"replace {PLACEHOLDER_RECIPE} with a recipe that builds this model "
                     f"({job.model.num_layers} layers)")
        warnings.append(f"Megatron-Bridge has no recipe for {job.model.name}: the export names a "
                        f"{PLACEHOLDER_RECIPE} placeholder")
    lines.append(f"recipe={recipe}")
    lines.append(f"model.num_layers={job.model.num_layers}")
    lines += [f"{k}={_value(v)}" for k, v in overrides]
    return Export(ExportTarget.MEGATRON_BRIDGE, "\n".join(lines) + "\n", tuple(warnings))


def parse_overrides(text: str) -> tuple[str | None, dict[str, str]]:
    """``recipe=...`` and ``field=value`` lines (comments and blanks skipped) -> (recipe, fields)."""
    recipe, fields = None, {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or not key:
            raise MeshplanError(f"Megatron-Bridge overrides line {n}: {line!r} is not field=value")
        value = value.strip().strip('"').strip("'")
        if key == "recipe":
            recipe = value
        else:
            fields[key.strip()] = value
    return recipe, fields


def megatron_flags_from_bridge(fields: dict[str, str]) -> str:
    """The Megatron-LM arguments these Bridge fields stand for, for the Megatron importer."""
    by_field = {f: flag for flag, f in FIELDS.items()}
    words: list[str] = []
    for key, value in fields.items():
        if key in by_field:
            flag = by_field[key]
            if value == "true":
                words.append(flag)
            elif value not in ("false", "null") and ABSENT.get(flag) != value:
                words += [flag, value]
        elif key == MODULES_FIELD and value not in ("null", "[]"):  # a Hydra list: [moe_act,layernorm]
            words += [MODULES_FLAG, *(m.strip() for m in value.strip("[]").split(",") if m.strip())]
        elif key == VPP_FIELD and value != "null":
            words += ["--num-virtual-stages-per-pipeline-rank", value]
        elif key == PRECISION_FIELD and value != "null":
            flags = {v: k for k, v in PRECISIONS.items()}.get(value)
            if flags is None:
                raise MeshplanError(f"Megatron-Bridge mixed_precision {value!r} is not one of "
                                    f"{', '.join(PRECISIONS.values())}")
            words += list(flags) + (["hybrid"] if "--fp8-format" in flags else [])
    return " ".join(f"'{w}'" if "|" in w or "*" in w else w for w in words)


def import_megatron_bridge(text: str, *, num_gpus: int, model: ModelSpec | None):
    """Bridge overrides -> (MegatronImport, the recipe's meshplan preset or None). ``model`` is the
    model to use (from --model or the recipe's preset); its layer count must be the text's."""
    from meshplan.export.import_megatron import import_megatron

    recipe, fields = parse_overrides(text)
    if model is None:
        raise MeshplanError(f"Megatron-Bridge recipe {recipe!r} has no meshplan preset: give --model")
    layers = fields.get("model.num_layers")
    if layers is not None and layers != str(model.num_layers):
        raise MeshplanError(f"Megatron-Bridge model.num_layers={layers} but {model.name} has {model.num_layers} layers")
    for need in ("train.global_batch_size", "model.seq_length"):
        if need not in fields:
            raise MeshplanError(f"Megatron-Bridge overrides give no {need} (the recipe's is not known here)")
    # A recipe sets its own dispatcher (not known here): without the override, meshplan's default.
    imp = import_megatron(megatron_flags_from_bridge(fields), num_gpus=num_gpus, model=model, name=model.name,
                          default_dispatcher=None)
    return imp


def recipe_preset(recipe: str | None) -> str | None:
    for preset, r in RECIPES.items():
        if r == recipe:
            return preset
    return None
