"""`meshplan train`: run a plan file on PyTorch distributed (torch is imported by the workers only)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import ClusterProfileOpt, JsonOpt, OverrideOpt, console, print_json, path_value
from meshplan.cli.checks import count_flag, output_path, positive_rate
from meshplan.cli.main import app
from meshplan.errors import MeshplanError
from meshplan.targets import Target
from meshplan.plan import Job
from meshplan.runtime.lifecycle import DEFAULT_COLLECTIVE_TIMEOUT_S
from meshplan.shipped import shipped_path
from meshplan.spec.model import parse_overrides
from meshplan.spec.training import Precision
from meshplan.textfile import check_text_file

DEFAULT_DRY_RUN_RANKS = "first,last"
"""``--dry-run`` simulates rank 0 (first pipeline stage) and the last rank (last stage) by default."""
SAMPLE_DATA = "sample"
"""``--data sample`` picks the shipped sample text (src/meshplan/data/sample.txt)."""


def resolve_data(data: str | None, tokenized: bool = False) -> str | None:
    """The data path; with a tokenizer it may also be a saved `datasets` directory."""
    if data is None:
        return None
    if data == SAMPLE_DATA and not Path(data).exists():
        return str(shipped_path("meshplan.data", "sample.txt"))
    if tokenized and Path(data).is_dir():  # a saved `datasets` directory
        return data
    if tokenized:  # jsonl, parquet (binary) or text, read by the tokenizing loader
        if not Path(data).is_file():
            raise MeshplanError(f"{data}: no such data file")
        return data
    check_text_file(data, what="data file")
    return data


@app.command("train")
def train(
    plan: Annotated[Path, typer.Option("--plan", "-p", parser=path_value, help="Plan file from `meshplan plan --out` (a Job JSON).")],
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.", min=1)] = 20,
    data: Annotated[Optional[str], typer.Option("--data", help="Local text file (byte tokens), or 'sample' for the shipped text. Default: synthetic tokens.")] = None,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights and data.")] = 0,
    log: Annotated[Optional[Path], typer.Option("--log", parser=path_value, help="JSON-lines log: one object per step, then a summary.")] = None,
    override: OverrideOpt = None,
    cluster_profile: ClusterProfileOpt = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", parser=path_value, help="Save sharded checkpoints here (step-NNNNNN directories).")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Save every N steps (and after the last); 0: only after the last.", min=0)] = 0,
    checkpoint_keep: Annotated[Optional[int], typer.Option("--checkpoint-keep", help="Keep only the newest K complete checkpoints.", min=1)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest complete checkpoint in --checkpoint-dir (any plan and GPU count); --steps stays the total.")] = False,
    collective_timeout_s: Annotated[float, typer.Option("--collective-timeout-s", help="Seconds a collective waits for a lost rank before the run fails.")] = DEFAULT_COLLECTIVE_TIMEOUT_S,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what each chosen rank would build at the plan's full world size (mesh groups, pipeline stages, parameter shards, memory next to the cost model), at once and without building anything.")] = False,
    simulate: Annotated[bool, typer.Option("--simulate", help="With --dry-run: also run two training steps of each chosen rank on torch's fake process group and fake tensors (minutes per rank; no GPU, no real memory) and print measured memory and collectives next to the cost model.")] = False,
    ranks: Annotated[str, typer.Option("--ranks", help="With --dry-run: first,last (default), all, or a list of ranks such as 0,7,31.")] = DEFAULT_DRY_RUN_RANKS,
    init_from: Annotated[Optional[Path], typer.Option("--init-from", parser=path_value, help="Local Hugging Face model directory (config.json + safetensors): its model and weights replace the plan's model and the random init.")] = None,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", parser=path_value, help="Local tokenizer directory (tokenizer.json): --data is then .jsonl / .parquet / .txt or a saved datasets directory, tokenised and packed.")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Held-out loss every N steps (needs --tokenizer and --eval-fraction).", min=0)] = 0,
    eval_fraction: Annotated[float, typer.Option("--eval-fraction", help="Share of the packed sequences held out for --eval-every.")] = 0.0,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Linear learning-rate warmup steps.", min=0)] = 0,
    cosine: Annotated[bool, typer.Option("--cosine", help="Cosine decay of the learning rate after warmup, to --min-lr-ratio x --lr at the last step.")] = False,
    min_lr_ratio: Annotated[float, typer.Option("--min-lr-ratio", help="Final learning rate of --cosine, as a fraction of --lr.")] = 0.0,
    clip_grad: Annotated[float, typer.Option("--clip-grad", help="Clip the global gradient norm to this (0: no clipping).", min=0.0)] = 0.0,
    weight_decay: Annotated[float, typer.Option("--weight-decay", help="AdamW weight decay of matrices and embeddings (never of biases and norms).", min=0.0)] = 0.0,
    expert_load_log: Annotated[Optional[Path], typer.Option("--expert-load-log", parser=path_value, help="MoE routing log (JSON lines): per step, per MoE layer, the tokens each expert received; `meshplan estimate --expert-load` reads it.")] = None,
    allow_over_memory: Annotated[bool, typer.Option("--allow-over-memory", help="Launch on GPUs even where the cost model puts a rank's peak memory over the GPU's (its memory error: docs/accuracy.md).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Train the plan's model for some steps with the plan's parallel layout (one process per rank, gloo on CPU, nccl on GPU)."""
    from meshplan.runtime.launch import check_machine, launch, under_torchrun, visible_gpus
    from meshplan.runtime.support import check_runnable

    job = Job.load(plan)
    if override:
        model = job.model.with_overrides(parse_overrides(override))
        job = Job(model=model, training=job.training, cluster=job.cluster, plan=job.plan)
    positive_rate("--lr", lr)
    count_flag("--steps", steps)
    count_flag("--seed", seed, minimum=0)
    count_flag("--checkpoint-every", checkpoint_every, minimum=0)
    count_flag("--checkpoint-keep", checkpoint_keep)
    output_path(log, "--log", "training log")
    output_path(expert_load_log, "--expert-load-log", "routing log")
    if expert_load_log is not None and not job.model.is_moe:
        raise MeshplanError(f"--expert-load-log logs MoE routing; {job.model.name} has no experts")
    if init_from is not None:
        job = _job_for_checkpoint(job, init_from)
    _check_loop_flags(job, data, tokenizer, eval_every, eval_fraction, weight_decay)
    data_path = resolve_data(data, tokenized=tokenizer is not None)
    if data_path is not None and tokenizer is None:  # the workers' own check, before starting them
        from meshplan.runtime.data import load_text_tokens

        load_text_tokens(data_path, job.model.vocab_size, job.training.seq_len)
    if ranks != DEFAULT_DRY_RUN_RANKS and not dry_run:
        raise MeshplanError("--ranks picks the ranks of a --dry-run; add --dry-run")
    if simulate and not dry_run:
        raise MeshplanError("--simulate runs the steps of a --dry-run; add --dry-run")
    text_data = data_path is not None and tokenizer is None
    if dry_run:  # before the machine check: a dry run needs no GPU
        from meshplan.cli.dryrun_cmd import dry_run as run_dry

        run_dry(job, ranks, json_out, simulate=simulate, cluster_profile=cluster_profile, text_data=text_data)
        return
    check_runnable(job, text_data=text_data)
    if job.cluster.gpu.name != "cpu" and not allow_over_memory and not under_torchrun():
        _check_gpu_memory(job, cluster_profile)  # the plan's problem before the machine's
    check_machine(job, plan, visible_gpus())  # never one CPU process per planned GPU
    if not (math.isfinite(collective_timeout_s) and collective_timeout_s > 0):
        raise MeshplanError(f"--collective-timeout-s must be a positive number of seconds, got {collective_timeout_s}")
    if job.cluster.gpu.name == "cpu" and not under_torchrun():
        _check_host_memory(job, cluster_profile)
    if cluster_profile:  # a bad profile fails now, not after training
        from meshplan.calib.hwprofile import load_profile

        load_profile(cluster_profile)
    if checkpoint_dir is None and (resume or checkpoint_every or checkpoint_keep):
        raise MeshplanError("--resume, --checkpoint-every and --checkpoint-keep need --checkpoint-dir")
    if checkpoint_dir is not None and (not under_torchrun() or _is_rank0()):
        from meshplan.ckpt_meta import check_resume, read_meta

        resume_from = check_resume(checkpoint_dir, job.model, resume=resume)  # refuse a bad one before launching
        saved = read_meta(resume_from) if resume_from else None
        done = saved.step if saved else 0
        if saved and saved.job.training != job.training:
            console().print(f"note: {resume_from} was trained with {saved.job.training.to_dict()}; "
                            f"continuing with {job.training.to_dict()}")
        if done >= steps:
            console().print(f"nothing to do: {resume_from} is at step {done}, --steps is {steps}")
            return

    from meshplan.runtime.train_config import TrainConfig  # noqa: E402  (imports torch only here)

    with tempfile.TemporaryDirectory(prefix="meshplan-train-") as tmp:
        log_path = str(log) if log else str(Path(tmp) / "log.jsonl")
        cfg = TrainConfig(steps=steps, lr=lr, seed=seed, data=data_path, log_path=log_path,
                          progress=not json_out,
                          checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
                          checkpoint_every=checkpoint_every, checkpoint_keep=checkpoint_keep, resume=resume,
                          collective_timeout_s=collective_timeout_s,
                          init_from=str(init_from) if init_from else None,
                          tokenizer=str(tokenizer) if tokenizer else None, eval_every=eval_every,
                          eval_fraction=eval_fraction, warmup_steps=warmup_steps, cosine=cosine,
                          min_lr_ratio=min_lr_ratio, clip_grad=clip_grad, weight_decay=weight_decay,
                          expert_load_log=str(expert_load_log) if expert_load_log else None)
        launch([(job, cfg)])
        if under_torchrun() and not _is_rank0():
            return
        from meshplan.calib.predict import attach_prediction, comparison_table

        versus = attach_prediction(job, log_path, cluster_profile)  # adds both to the log's summary
        lines = [json.loads(x) for x in Path(log_path).read_text().splitlines()]
    summary = next((x for x in lines if x.get("summary")), None)
    if summary is None:
        raise MeshplanError("training ended without a summary (see the messages above)")
    if json_out:
        print_json(summary)
        return
    t = Table(title=f"meshplan train: {job.model.name}  {summary['plan']}  ({summary['world_size']} processes)")
    for col in ("steps", "first loss", "final loss", "step time s", "tokens/s", "peak mem GiB", "MFU"):
        t.add_column(col, justify="right")
    t.add_row(str(summary["steps"]), f"{summary['first_loss']:.4f}", f"{summary['final_loss']:.4f}",
              f"{summary['mean_step_time_s']:.3f}", f"{summary['mean_tokens_per_s']:,.0f}",
              f"{summary['peak_memory_gib']:.2f}", f"{summary['mfu']:.1%}" if summary["mfu"] else "-")
    console().print(t)
    console().print(comparison_table(versus))
    if not cluster_profile:
        console().print("[dim]no hardware profile: the prediction uses preset rates; run `meshplan profile "
                        "--out profile.json` and pass --cluster-profile profile.json for a calibrated one[/dim]")


def _job_for_checkpoint(job: Job, model_dir: Path) -> Job:
    """The plan's Job with the model read from ``model_dir``'s config.json, its weights checked
    (every tensor mapped, the numerics supported) before anything is launched."""
    from meshplan.runtime.hf_weights import check_checkpoint
    from meshplan.spec.hf import load_hf_config

    if not model_dir.is_dir():
        raise MeshplanError(f"--init-from {model_dir}: no such directory")
    model = load_hf_config(model_dir)
    check_checkpoint(model_dir, model)
    return Job(model=model, training=job.training, cluster=job.cluster, plan=job.plan)


def _check_loop_flags(job: Job, data: str | None, tokenizer: Path | None, eval_every: int,
                      eval_fraction: float, weight_decay: float) -> None:
    if tokenizer is not None and data is None:
        raise MeshplanError("--tokenizer needs --data (the documents to tokenise)")
    if eval_every and (tokenizer is None or eval_fraction <= 0):
        raise MeshplanError("--eval-every needs --tokenizer and an --eval-fraction above 0 (the held-out split)")
    if eval_every and job.plan.dims.pp > 1:
        raise MeshplanError("--eval-every is not supported with pipeline parallel (pp > 1)")
    if weight_decay and job.training.optimizer.value != "adamw":
        raise MeshplanError(f"--weight-decay needs the adamw optimizer, the plan uses {job.training.optimizer.value}")


def host_memory_bytes() -> int:
    """This machine's physical memory (POSIX sysconf)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_host_memory(job: Job, cluster_profile: str | None) -> None:
    """The ranks of a CPU run share this machine's memory: refuse a plan whose ranks together need
    more than it has (the cost model's peak of each rank's pipeline stage), before any is started."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cost import estimate

    training = job.training
    try:
        job.cluster.gpu.peak_flops(training.precision)
    except MeshplanError:
        # The CPU preset has no rate for this precision, so the cost model cannot cost it; fp32
        # weights and activations hold at least as many bytes, so the fp32 figure bounds the need.
        training = replace(training, precision=Precision.FP32, recipe=None)
    hw = resolve_hardware(job.cluster, training.precision, cluster_profile, "meshplan")
    est = estimate(job.model, hw.cluster, training, job.plan, hw.calib)
    d = job.plan.dims
    need = sum(s.memory.total_bytes for s in est.stages) * (d.world_size // d.pp)
    have = host_memory_bytes()
    if need > have:
        raise MeshplanError(f"{job.model.name} on {d.world_size} CPU processes needs about {need / 2**30:,.1f} GiB "
                            f"(the cost model's peak of each rank) and this machine has {have / 2**30:,.1f} GiB: "
                            f"plan a smaller model, or check the plan with --dry-run")


def _check_gpu_memory(job: Job, cluster_profile: str | None) -> None:
    """Refuse, before any rank starts, a plan whose peak memory on some rank the cost model puts over
    the GPU's (meshplan's runtime runs it: its calibration), rather than an out-of-memory error minutes
    into the run; ``--allow-over-memory`` launches it anyway."""
    from meshplan.calib.hardware import resolve_hardware
    from meshplan.cost import estimate

    hw = resolve_hardware(job.cluster, job.training.precision, cluster_profile, Target.MESHPLAN.value)
    est = estimate(job.model, hw.cluster, job.training, job.plan, hw.calib)
    if not est.fits:
        raise MeshplanError(f"{job.model.name} with {job.plan.notation()} does not fit {job.cluster.gpu.name}: "
                            f"short by {est.memory_shortfall_gib:.1f} GiB on its fullest rank (the cost model, "
                            f"meshplan's runtime); plan again (meshplan plan), or launch anyway with --allow-over-memory")


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"
