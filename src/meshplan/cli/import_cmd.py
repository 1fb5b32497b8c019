"""`meshplan import --from megatron "ARGS..."` / `--from torchtitan FILE` (TOML or >= 0.3 command
line) -> a Job file."""

from __future__ import annotations

import enum
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import JsonOpt, console, err_console, load_model, print_json, path_value
from meshplan.cli.flags import ClusterFlags, ModelFlags, with_flags
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.plan import Job
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import parse_overrides
from meshplan.textfile import read_text_file
from meshplan.targets import Target


class ImportSource(str, enum.Enum):
    MEGATRON = "megatron"
    MEGATRON_BRIDGE = "megatron-bridge"
    TORCHTITAN = "torchtitan"


_STACK_OF = {ImportSource.MEGATRON: Target.MEGATRON, ImportSource.MEGATRON_BRIDGE: Target.MEGATRON,
             ImportSource.TORCHTITAN: Target.TORCHTITAN}
"""The stack that runs what each importer reads (Megatron-Bridge drives Megatron-Core)."""


def _cluster(flags: ClusterFlags, gpus: int | None, launcher_gpus: int | None,
             launcher_per_node: int | None) -> ClusterSpec:
    if flags.cluster is None and flags.gpu is None:
        raise MeshplanError("name the cluster the config runs on: --cluster dgx-a100 or --gpu a100-80gb")
    if flags.nodes is None and gpus is None and launcher_gpus is not None:
        gpus = launcher_gpus
        flags = replace(flags, gpus_per_node=flags.gpus_per_node or launcher_per_node)
    if flags.nodes is None and gpus is None:
        raise MeshplanError("give the GPU count: --gpus N or --nodes N")
    return flags.spec(gpus=gpus)


def _read_args(config: str) -> str:
    """The argument string itself, or the contents of ``@file``, or of a file named alone (one word
    that is a file: as Megatron-Bridge's and torchtitan's imports read theirs; read as a launch
    line it would be a program with no arguments, refused for want of --global-batch-size)."""
    if not config.startswith("@"):
        if len(config.split()) != 1 or not Path(config.strip()).is_file():
            return config
        config = "@" + config.strip()
    return read_text_file(config[1:], what="file of Megatron arguments", allow_empty=False,
                          missing="cannot read the Megatron arguments (no such file)")


def _save(job: Job, out: Path) -> None:
    try:
        job.save(out)
    except OSError as exc:
        raise MeshplanError(f"cannot write {out}: {exc.strerror}") from None


LEGACY_FRAMEWORK = "megatron-lm"
"""The frameworks.json entry of a Megatron-LM 2020-22 command line (import_megatron_parser.LEGACY_FLAGS)."""


def _calibration(job: Job, legacy: tuple[str, ...]) -> dict[str, object]:
    """Which calibration the Job is estimated with (its stack's, with the settings of the framework
    the stack stands for today: calib/hardware.py), its tokens/s/GPU; for a command line of
    Megatron-LM 2020-22 also the estimate with that framework's settings (``legacy``; None
    otherwise). The Job keeps today's stack: its exports, searches and ``plan --compare`` are for
    the stack that runs it now."""
    from meshplan.calib.hardware import TARGET_FRAMEWORKS, framework_calibration, resolve_hardware
    from meshplan.cost import estimate

    hw = resolve_hardware(job.cluster, job.training.precision, None, job.target)
    now = estimate(job.model, hw.cluster, job.training, job.plan, calib=hw.calib)
    out: dict[str, object] = {"stack": job.target, "framework": TARGET_FRAMEWORKS.get(job.target or "", job.target),
                              "source": hw.calib.source, "tokens_per_s_per_gpu": now.tokens_per_s_per_gpu,
                              "legacy": None}
    if legacy:
        calib = framework_calibration(job.cluster, job.training.precision, LEGACY_FRAMEWORK)
        then = estimate(job.model, job.cluster, job.training, job.plan, calib=calib)
        out["legacy"] = {"flags": list(legacy), "framework": LEGACY_FRAMEWORK, "source": calib.source,
                         "tokens_per_s_per_gpu": then.tokens_per_s_per_gpu}
    return out


@app.command("import", context_settings={"ignore_unknown_options": True})
@with_flags(model_flags=ModelFlags, cluster_flags=ClusterFlags)
def import_(
    source: Annotated[ImportSource, typer.Option("--from", help="Framework of the config.")],
    config: Annotated[str, typer.Argument(help="Megatron: the argument string (or @file, or the file's path). Megatron-Bridge: the overrides file. torchtitan: a TOML file or a file holding the >= 0.3 command line.")],
    model_flags: ModelFlags,
    cluster_flags: ClusterFlags,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="Total GPUs (instead of --nodes).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=path_value, help="Write the Job file here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Turn a Megatron-LM command line, Megatron-Bridge overrides or a torchtitan TOML / command line into a meshplan Job file."""
    model, override = model_flags.model, model_flags.override
    base_model = model_flags.spec() if model else None
    ignored: tuple[str, ...] = ()
    legacy: tuple[str, ...] = ()
    if source == ImportSource.MEGATRON:
        from meshplan.export.import_megatron import import_megatron, launcher_size

        text = _read_args(config)
        spec_cluster = _cluster(cluster_flags, gpus, *launcher_size(text))
        imp = import_megatron(text, num_gpus=spec_cluster.num_gpus, model=base_model,
                              name=base_model.name if base_model else "megatron-model")
        spec = imp.model or base_model
        if spec is None:
            raise MeshplanError("the Megatron arguments give no model shape (--num-layers, --hidden-size, "
                                "--num-attention-heads): give --model")
        if imp.model is not None and override:
            spec = spec.with_overrides(parse_overrides(override))
        plan, training, ignored, legacy = imp.plan, imp.training, imp.ignored, imp.legacy_flags
    elif source == ImportSource.MEGATRON_BRIDGE:
        from meshplan.export.megatron_bridge import import_megatron_bridge, recipe_preset
        from meshplan.export.megatron_bridge import parse_overrides as parse_bridge

        text = _read_args(config if config.startswith("@") else "@" + config)
        if base_model is None:
            preset = recipe_preset(parse_bridge(text)[0])
            base_model = load_model(preset, override) if preset else None
        spec_cluster = _cluster(cluster_flags, gpus, None, None)
        imp = import_megatron_bridge(text, num_gpus=spec_cluster.num_gpus, model=base_model)
        spec, plan, training = base_model, imp.plan, imp.training
    else:
        from meshplan.export.import_torchtitan import import_torchtitan, load_config

        cfg, preset = load_config(config)
        if base_model is None:
            if preset is None:
                raise MeshplanError("the torchtitan model (TOML [model] name/flavor or --module/--config) "
                                    "has no meshplan preset: give --model")
            base_model = load_model(preset, override)
        spec = base_model
        spec_cluster = _cluster(cluster_flags, gpus, None, None)
        imp_t = import_torchtitan(cfg, num_gpus=spec_cluster.num_gpus, num_layers=spec.num_layers)
        plan, training = imp_t.plan, imp_t.training
    # the file describes a run of that framework: every command estimates it with its stack's
    # calibration (Job.target), as for a plan made with `meshplan plan --target`
    job = Job(model=spec, training=training, cluster=spec_cluster, plan=plan, target=_STACK_OF[source].value)
    if out is not None:
        _save(job, out)
    calibration = _calibration(job, legacy)
    if json_out:
        print_json({**job.to_dict(), "notation": plan.notation(), "ignored_flags": list(ignored),
                    "calibration": calibration, "out": str(out) if out else None})
        return
    t = Table(title=f"Imported from {source.value}", show_header=False)
    t.add_row("model", f"{spec.name} ({spec.num_params() / 1e9:.2f}B params, {spec.num_layers} layers)")
    t.add_row("cluster", f"{spec_cluster.name}: {spec_cluster.num_nodes} x {spec_cluster.gpus_per_node} {spec_cluster.gpu.name}")
    t.add_row("training", f"seq {training.seq_len}, global batch {training.global_batch}, {training.precision.value}")
    t.add_row("plan", plan.notation())
    t.add_row("estimated as", f"{calibration['framework']} ({calibration['stack']} calibration)")
    console().print(t)
    if calibration["legacy"] is not None:
        then = calibration["legacy"]
        console().print(
            f"this command line is Megatron-LM 2020-22 style ({', '.join(legacy)}); meshplan estimates the job "
            f"as today's {calibration['framework']} runs it: {calibration['tokens_per_s_per_gpu']:,.0f} tok/s/GPU. "
            f"As {then['framework']} of that era ran it (no fused attention, dropout, no TP communication overlap: "
            f"how `meshplan validate` costs the published runs of that era): {then['tokens_per_s_per_gpu']:,.0f} "
            "tok/s/GPU", soft_wrap=True, markup=False, highlight=False)
    if ignored:
        err_console().print(f"ignored {len(ignored)} flags that do not affect the plan "
                            f"({', '.join(ignored[:6])}{', ...' if len(ignored) > 6 else ''})")
    if out is not None:
        err_console().print(f"wrote {out}")
