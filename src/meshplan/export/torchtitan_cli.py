"""Job -> torchtitan's current command line: ``--module M --config F`` plus dotted overrides.

torchtitan 0.3.0 dropped TOML job files: ``ConfigManager.parse_args`` loads a config function
from ``torchtitan.models.<module>.config_registry`` and applies ``--<section>.<field> value``
overrides to it with tyro (torchtitan/config/manager.py, 0.3.0). The degrees and batch sizes are
the TOML form's (torchtitan.py, one mapping for both forms); what changed in 0.3.0 is mapped here:
- activation checkpointing is a tyro subcommand (``activation_checkpoint:full|selective|none``)
  and layer-level selective checkpointing (every k-th block) is gone;
- pipeline split points are gone: the split is written as the module names of every stage
  (``parallelism.module_fqns_per_model_part``), which expresses any split exactly;
- the context-parallel rotate method is gone (torch's default ring is used);
- float8 is set on the config function's model_spec, which the command line cannot reach;
- CUDA graphs must be disabled with pipeline parallelism (Trainer.Config.__post_init__).
Older versions get the TOML form. The checked version list is in docs/interop.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.export.base import Export, ExportTarget
from meshplan.export.torchtitan import export_torchtitan, torchtitan_sections
from meshplan.launch_env import env_assignments
from meshplan.plan import Job

CURRENT_VERSION = "0.3.0"
"""The torchtitan release the command-line form was checked against (PyPI, 2026)."""
FIRST_CLI_VERSION = (0, 3)
"""First torchtitan release without TOML job files (--module/--config instead of --job.config_file)."""

# meshplan preset -> (module, config function) in torchtitan 0.3.0's config registries
# (torchtitan/models/<module>/config_registry.py): same architecture numbers.
REGISTRY: dict[str, tuple[str, str]] = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3.1-405b": ("llama3", "llama3_405b"),
    "toy-llama": ("llama3", "llama3_debugmodel"),
}
PLACEHOLDER_MODULE = "MODULE"
PLACEHOLDER_CONFIG = "CONFIG"
"""Written for a model torchtitan has no registry entry for, with a note saying so."""

FIRST_STAGE_MODULES = ("tok_embeddings",)
LAST_STAGE_MODULES = ("norm", "lm_head")
"""Module names around the blocks (torchtitan/distributed/pipeline_parallel.py, 0.3.0)."""

MAX_ARG_BYTES = 131072
"""Longest single word of a command line Linux passes to a program: MAX_ARG_STRLEN = 32 pages
of 4 KiB (include/uapi/linux/binfmts.h). One stage's module names are one word."""


def parse_version(version: str) -> tuple[int, ...]:
    """'0.3.0' -> (0, 3, 0); a version that is not dotted integers is bad input."""
    head = version.strip().lstrip("v").split("+")[0]
    parts = head.split(".")
    if not head or not all(p.isdigit() for p in parts):
        raise MeshplanError(f"torchtitan version {version!r} is not of the form 0.3.0")
    return tuple(int(p) for p in parts)


def installed_version() -> str | None:
    """The installed torchtitan's version, read from its metadata (nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return None


def uses_command_line(version: str) -> bool:
    return parse_version(version)[:2] >= FIRST_CLI_VERSION


def stage_modules(stage_layers: tuple[int, ...]) -> list[list[str]]:
    """Module names of every (virtual) stage, in order: embeddings first, norm and head last.
    A stage whose names cannot be one command-line word (:data:`MAX_ARG_BYTES`) is refused
    before any name is built (``layers.J,`` is 9 bytes at least)."""
    widest = max(stage_layers, default=0)
    if widest * len("layers.0,") > MAX_ARG_BYTES:
        raise MeshplanError(f"a pipeline stage of {widest} layers: torchtitan's module_fqns_per_model_part "
                            f"names each, more than one command-line word holds ({MAX_ARG_BYTES} bytes, "
                            "Linux MAX_ARG_STRLEN); plan more pipeline stages")
    parts, start = [], 0
    for i, n in enumerate(stage_layers):
        names = [f"layers.{j}" for j in range(start, start + n)]
        if i == 0:
            names = [*FIRST_STAGE_MODULES, *names]
        if i == len(stage_layers) - 1:
            names = [*names, *LAST_STAGE_MODULES]
        parts.append(names)
        start += n
    return parts


@dataclass(frozen=True)
class CommandLine:
    """The parts of a torchtitan >= 0.3 command line."""

    module: str
    config: str
    overrides: tuple[tuple[str, str], ...]
    """(dotted option, value); a value of '' is a flag."""
    ac_mode: str
    """activation_checkpoint subcommand: full, selective or none."""

    def args(self) -> list[str]:
        """The argument list ``ConfigManager().parse_args`` takes."""
        out = ["--module", self.module, "--config", self.config]
        for opt, value in self.overrides:
            out += [f"--{opt}", *value.split(" ")] if value else [f"--{opt}"]
        # tyro: options of the parent come before the subcommand
        return out + [f"activation_checkpoint:{self.ac_mode}"]


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


def command_line(job: Job) -> tuple[CommandLine, list[str]]:
    """The torchtitan 0.3 command line for ``job``, and the warnings."""
    sections, warnings = torchtitan_sections(job)
    if "model" in sections:  # float8 converter
        raise MeshplanError("torchtitan 0.3 turns float8 on in a config function's model_spec "
                            "(e.g. llama3_debugmodel_float8), which the command line cannot set: "
                            "export with --target-version 0.2 or write a config function")
    if "expert_tensor_parallel_degree" in sections["parallelism"]:
        raise MeshplanError("torchtitan 0.3 has no expert tensor parallel degree of its own (its "
                            "experts follow the dense tp): plan with etp equal to tp")
    ac = sections["activation_checkpoint"]
    option = ac.get("selective_ac_option")
    if option is not None and option != "op":
        raise MeshplanError("torchtitan 0.3 dropped layer-level selective checkpointing (every "
                            f"{option}-th block): recompute all layers, none, or use --target-version 0.2")
    plan = job.full_plan
    # a bool that defaults to False is a bare flag for tyro (like training.disable_cuda_graphs)
    overrides: list[tuple[str, str]] = [(f"training.{k}", "" if v is True else _value(v))
                                        for k, v in sections["training"].items()]
    par = dict(sections["parallelism"])
    par.pop("pipeline_parallel_split_points", None)
    if par.pop("context_parallel_rotate_method", None) == "alltoall":
        warnings.append("torchtitan 0.3 has no rotate-method option: context parallel runs its ring")
    overrides += [(f"parallelism.{k}", _value(v)) for k, v in par.items()]
    if plan.dims.pp > 1:
        parts = stage_modules(plan.stage_layers)
        # tyro reads list[list[str]] as one comma-separated word per inner list
        overrides.append(("parallelism.module_fqns_per_model_part", " ".join(",".join(p) for p in parts)))
        overrides.append(("training.disable_cuda_graphs", ""))
    module, config = REGISTRY.get(job.model.name, (PLACEHOLDER_MODULE, PLACEHOLDER_CONFIG))
    return CommandLine(module, config, tuple(overrides), str(ac["mode"])), warnings


def export_torchtitan_cli(job: Job, version: str = CURRENT_VERSION) -> Export:
    cmd, warnings = command_line(job)
    c = job.cluster
    lines = [f"# meshplan plan: {job.plan.notation()} on {c.num_gpus} GPUs ({c.num_nodes} nodes x {c.gpus_per_node})",
             f"# torchtitan {version}: --module/--config name a config_registry function; "
             "the options below override it"]
    if cmd.module == PLACEHOLDER_MODULE:
        lines.append(f"# torchtitan {version} has no config function for {job.model.name}: replace "
                     f"{PLACEHOLDER_MODULE}/{PLACEHOLDER_CONFIG} with one that builds this model")
        warnings.append(f"torchtitan has no registry entry for {job.model.name}: the command names "
                        f"{PLACEHOLDER_MODULE}/{PLACEHOLDER_CONFIG} placeholders")
    # the allocator setting torchtitan's run_train.sh gives, which a bare torchrun would not
    words = [f"{env_assignments()} torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node} -m torchtitan.train"]
    words += [f"--module {cmd.module} --config {cmd.config}"]
    words += [f"--{opt}" + (f" {_quote(v)}" if v else "") for opt, v in cmd.overrides]
    words += [f"activation_checkpoint:{cmd.ac_mode}"]
    text = "\n".join(lines) + "\n" + " \\\n  ".join(words) + "\n"
    return Export(ExportTarget.TORCHTITAN, text, tuple(warnings))


def _quote(value: str) -> str:
    # one word per inner list of module names: keep the spaces between them as separators
    return " ".join(shlex.quote(w) for w in value.split(" "))


def export_torchtitan_for(job: Job, version: str | None = None) -> Export:
    """The form the named (or installed, or else the current) torchtitan version reads."""
    version = version or installed_version() or CURRENT_VERSION
    if uses_command_line(version):
        return export_torchtitan_cli(job, version)
    return export_torchtitan(job)
