"""torchtitan config -> Plan and TrainingSpec (the model comes from --model or a known torchtitan
flavor / config function). Both forms are read: the job config TOML (torchtitan < 0.3) and the
command line of torchtitan >= 0.3 (import_torchtitan_cli.py turns it into the same sections).
The GPU count is in neither (torchrun sets it): it is an input.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.export.torchtitan import SCHEDULE_NAMES
from meshplan.plan import (
    CPMethod, ParallelDims, Plan, Recompute, Schedule, data_parallel_degree, even_split, torchtitan_split,
)
from meshplan.spec.training import Precision, TrainingSpec
from meshplan.textfile import read_text_file

# torchtitan model name/flavor -> meshplan preset (same architecture numbers)
FLAVOR_PRESETS = {
    ("llama3", "8b"): "llama3-8b",
    ("llama3", "70b"): "llama3-70b",
    ("llama3", "405b"): "llama3.1-405b",
    ("llama3", "debugmodel"): "toy-llama",
}


@dataclass(frozen=True)
class TorchtitanImport:
    plan: Plan
    training: TrainingSpec
    preset: str | None
    """meshplan preset for the TOML's [model] name/flavor, when known."""


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    text = read_text_file(p, what="torchtitan config (TOML)", missing="no such torchtitan config")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(f"{p}: not valid TOML ({exc})") from None


def load_config(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """Either form of a torchtitan config file -> (TOML-shaped sections, meshplan preset or None)."""
    from meshplan.export.import_torchtitan_cli import looks_like_command_line, parse_command_line, preset_for

    p = Path(path)
    text = read_text_file(p, what="torchtitan config (TOML or command line)", missing="no such torchtitan config")
    if looks_like_command_line(text):
        parsed = parse_command_line(text)
        return parsed.cfg, preset_for(parsed.module, parsed.config)
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(f"{p}: not valid TOML ({exc})") from None
    return cfg, flavor_preset(cfg)


def _int(section: dict[str, Any], key: str, default: int) -> int:
    v = section.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise MeshplanError(f"torchtitan config: {key} must be an integer, got {v!r}")
    return v


def _stage_layers(points: list[str], num_layers: int) -> tuple[int, ...]:
    starts = []
    for pt in points:
        head, _, idx = str(pt).partition(".")
        if head != "layers" or not idx.isdigit():
            raise MeshplanError(f"torchtitan split point {pt!r} is not of the form 'layers.<i>'")
        starts.append(int(idx))
    bounds = [0, *starts, num_layers]
    layers = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    # the first and the last stage may hold the embedding or the head alone (torchtitan's own split
    # with L + 2 stages, generate_llm_fqn_per_model_part); a middle stage needs a block
    if any(n < 0 for n in layers) or any(n < 1 for n in layers[1:-1]) or sum(layers) != num_layers:
        raise MeshplanError(f"torchtitan split points {points} leave an empty stage for {num_layers} layers")
    return layers


def import_torchtitan(cfg: dict[str, Any], *, num_gpus: int, num_layers: int) -> TorchtitanImport:
    par = cfg.get("parallelism", {})
    tr = cfg.get("training", {})
    ac = cfg.get("activation_checkpoint", {})
    model = cfg.get("model", {})
    rep = _int(par, "data_parallel_replicate_degree", 1)
    shard = _int(par, "data_parallel_shard_degree", -1)
    tp = _int(par, "tensor_parallel_degree", 1)
    pp = _int(par, "pipeline_parallel_degree", 1)
    cp = _int(par, "context_parallel_degree", 1)
    ep = _int(par, "expert_parallel_degree", 1)
    etp = _int(par, "expert_tensor_parallel_degree", 0)  # absent: as tp
    if shard == -1:  # torchtitan: the ranks left after the other degrees
        dp = data_parallel_degree(num_gpus, tp=tp, pp=pp, cp=cp)
        if rep < 1 or dp % rep:
            raise MeshplanError(f"{num_gpus} GPUs are not divisible by the other degrees ({rep * tp * pp * cp})")
        shard = dp // rep
    reshard = par.get("fsdp_reshard_after_forward", "default")
    # FSDP over dp_shard x cp (export/torchtitan.py); its 'default' policy reshards after forward
    # only without pipeline parallel (apply_fsdp: reshard_after_forward = not pp_enabled)
    if reshard not in ("always", "never", "default"):
        raise MeshplanError(f"parallelism.fsdp_reshard_after_forward {reshard!r} is not one of torchtitan's "
                            "'always', 'never', 'default'")
    keeps = reshard == "never" or (reshard == "default" and pp > 1)
    zero = 0 if shard * cp == 1 else (2 if keeps else 3)

    sched_by_name = {v.lower(): k for k, v in SCHEDULE_NAMES.items()}
    sched_name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if pp > 1 and sched_name.lower() not in sched_by_name:
        raise MeshplanError(f"torchtitan schedule {sched_name!r} has no meshplan equivalent "
                            f"({', '.join(SCHEDULE_NAMES.values())})")
    schedule = sched_by_name.get(sched_name.lower(), Schedule.ONE_F_ONE_B) if pp > 1 else Schedule.ONE_F_ONE_B
    stage_layers: tuple[int, ...] = ()
    # torchtitan's own split where the config names none (torchtitan/distributed/pipeline_parallel.py@02ef790
    # pipeline_llm): the embedding and the output weigh first/last_stage_less_layers layers each,
    # and a multi-stage schedule runs 2 stages per rank unless layers_per_stage sets the count
    in_w = _int(par, "pipeline_parallel_first_stage_less_layers", 1)
    out_w = _int(par, "pipeline_parallel_last_stage_less_layers", 1)
    if pp > 1 and par.get("pipeline_parallel_split_points"):
        stage_layers = _stage_layers(list(par["pipeline_parallel_split_points"]), num_layers)
    elif pp > 1 and par.get("pipeline_parallel_layers_per_stage"):
        per = _int(par, "pipeline_parallel_layers_per_stage", 1)
        if per < 1:
            raise MeshplanError(f"torchtitan config: pipeline_parallel_layers_per_stage must be >= 1, got {per}")
        stage_layers = torchtitan_split(num_layers, -(-(num_layers + in_w + out_w) // per), in_w, out_w)
    elif pp > 1:
        stage_layers = torchtitan_split(num_layers, pp * (2 if schedule.supports_virtual_stages else 1), in_w, out_w)
    n_stages = len(stage_layers) if stage_layers else pp
    if n_stages % pp:
        raise MeshplanError(f"{n_stages} pipeline stages do not spread evenly over pp={pp} ranks")
    vpp = n_stages // pp
    if vpp > 1 and not schedule.supports_virtual_stages:
        raise MeshplanError(f"{n_stages} stages on pp={pp} ranks need a looped schedule, not {sched_name!r}")

    dp = rep * shard
    seq_len = _int(tr, "seq_len", 2048)
    local = _int(tr, "local_batch_size", 8)
    global_batch = _int(tr, "global_batch_size", -1)
    if global_batch == -1:
        global_batch = local * dp
    micro = _int(par, "pipeline_parallel_microbatch_size", 1) if pp > 1 else local

    mode = str(ac.get("mode", "selective"))
    option = str(ac.get("selective_ac_option", "2"))
    layers = stage_layers or even_split(num_layers, n_stages)
    if mode == "none":
        recompute, rec = Recompute.NONE, ()
    elif mode == "full":
        recompute, rec = Recompute.FULL, ()
    elif mode == "selective" and option == "op":
        recompute, rec = Recompute.SELECTIVE, ()
    elif mode == "selective" and option.isdigit() and int(option) >= 1:
        k = int(option)
        recompute, rec = Recompute.FULL, tuple(n // k for n in layers)  # every k-th block
    else:
        raise MeshplanError(f"torchtitan activation_checkpoint mode={mode!r} option={option!r} is not understood")

    param = str(tr.get("mixed_precision_param", "bfloat16"))
    converters = model.get("converters", [])
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",")]
    precision = Precision.FP8 if "float8" in converters else (Precision.FP32 if param == "float32" else Precision.BF16)
    recipe = None
    if "float8" in converters:  # torchtitan's float8 default is tensorwise scaling
        recipe = str((cfg.get("float8") or {}).get("recipe_name") or "tensorwise")
    elif "mx" in converters:
        name = str((cfg.get("mx") or {}).get("recipe_name") or "mxfp8")
        # torchao's mxfp8 recipes differ by GEMM kernel (mxfp8_cublas, mxfp8_cutlass), not format
        precision, recipe = Precision.FP8, ("mxfp8" if name.startswith("mxfp8") else name)
    plan = Plan(
        dims=ParallelDims(dp_replicate=rep, dp_shard=shard, tp=tp, pp=pp, cp=cp, ep=ep,
                          etp=0 if etp == tp else etp),
        zero=zero,
        sp=tp > 1,  # torchtitan's TP plan shards norms over the sequence
        schedule=schedule,
        vpp=vpp,
        stage_layers=stage_layers,
        cp_method=CPMethod.ALL_TO_ALL if par.get("context_parallel_rotate_method") == "alltoall" else CPMethod.RING,
        micro_batch=micro,
        recompute=recompute,
        recompute_layers=rec,
    )
    return TorchtitanImport(plan=plan, training=TrainingSpec(seq_len=seq_len, global_batch=global_batch,
                                                             precision=precision, recipe=recipe),
                            preset=flavor_preset(cfg))


def flavor_preset(cfg: dict[str, Any]) -> str | None:
    """The meshplan preset for the TOML's [model] name and flavor, when one matches."""
    model = cfg.get("model", {})
    return FLAVOR_PRESETS.get((str(model.get("name", "")).lower(), str(model.get("flavor", "")).lower()))
