"""Flag groups shared by several commands: each option is declared once, here, and resolved once.

A group is a frozen dataclass whose fields are typer options (``Annotated``). ``@with_flags`` lists
a group's fields among a command's options and hands the command one instance of the group, so a
command writes ``cluster_flags: ClusterFlags`` instead of re-declaring ``--cluster --gpu --nodes
--gpus-per-node`` and re-assembling them. The groups: the model (``--model --override``), the
cluster (``--cluster --gpu --nodes --gpus-per-node``), the training run (``--seq-len
--global-batch --global-batch-tokens --precision --optimizer``) and the plan (``--dp ...
--cp-method``, in :mod:`meshplan.cli.plan_flags`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, replace
from typing import Annotated, Any, Callable, Optional

import typer

from meshplan.cli.common import (ClusterOpt, GlobalBatchOpt, GlobalBatchTokensOpt, GpuOpt, GpusPerNodeOpt,
                                 ModelOpt, NodesOpt, OptimizerOpt, OverrideOpt, PrecisionOpt, RecipeOpt, SeqLenOpt,
                                 load_cluster, load_model, make_training)
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.expert_load import ExpertLoad, read_expert_load, zipf_load
from meshplan.spec.model import ModelSpec, parse_overrides
from meshplan.spec.seqlen import DocBalance, load_seq_len_dist
from meshplan.spec.training import MoeDispatcher, Optimizer, Precision, TrainingSpec

DEFAULT_SEQ_LEN = 2048
"""Sequence length when neither --seq-len nor a Job file gives one."""


def with_flags(**groups: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@with_flags(cluster_flags=ClusterFlags)``: the command's parameter ``cluster_flags``
    becomes the group's options (in its place in ``--help``); the command receives one
    ``ClusterFlags`` built from them. Put it under ``@app.command``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        params: list[inspect.Parameter] = []
        for p in inspect.signature(command, eval_str=True).parameters.values():
            if p.name not in groups:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
                continue
            hints = typing.get_type_hints(groups[p.name], include_extras=True)
            params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                         annotation=hints[f.name])
                       for f in dataclasses.fields(groups[p.name])]

        @functools.wraps(command)
        def run(**options: Any) -> Any:
            for name, group in groups.items():
                options[name] = group(**{f.name: options.pop(f.name) for f in dataclasses.fields(group)})
            return command(**options)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


@dataclass(frozen=True, kw_only=True)
class ModelFlags:
    """What is trained: ``--model`` and ``--override``."""

    model: ModelOpt = None
    override: OverrideOpt = None

    def spec(self, job_model: ModelSpec | None = None, *,
             missing: str = "give --model (a preset name or a Hugging Face config.json)") -> ModelSpec:
        """--model wins; else the Job file's model (``--override`` applies to it); else ``missing``."""
        if self.model is not None:
            return load_model(self.model, self.override)
        if job_model is None:
            raise MeshplanError(missing)
        return job_model.with_overrides(parse_overrides(self.override)) if self.override else job_model


@dataclass(frozen=True, kw_only=True)
class ClusterFlags:
    """Where: ``--cluster`` or ``--gpu``, ``--nodes``, ``--gpus-per-node``."""

    cluster: ClusterOpt = None
    gpu: GpuOpt = None
    nodes: NodesOpt = None
    gpus_per_node: GpusPerNodeOpt = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.cluster, self.gpu, self.nodes, self.gpus_per_node))

    def spec(self, *, gpus: int | None = None, use_nodes: bool = True) -> ClusterSpec:
        """The named cluster; ``gpus`` sizes it instead of (or with) ``--nodes``."""
        return load_cluster(self.cluster, self.gpu, self.nodes if use_nodes else None, self.gpus_per_node,
                            gpus=gpus)


MoeDispatcherOpt = Annotated[Optional[MoeDispatcher], typer.Option(
    "--moe-dispatcher", help="MoE token dispatcher (Megatron --moe-token-dispatcher-type): alltoall "
    "(the default), allgather, flex (DeepEP).")]
MoeCapacityOpt = Annotated[Optional[float], typer.Option(
    "--moe-capacity-factor", help="MoE expert capacity over the mean tokens per expert; tokens beyond it "
    "are dropped (default: dropless).")]
SeqLenDistOpt = Annotated[Optional[str], typer.Option(
    "--seq-len-dist", help="Document lengths of the data, packed into --seq-len sequences with document "
    "masks: a histogram CSV (length,count), one length per line, or JSON lines with a \"length\" field "
    "(docs/data-aware.md).")]
DocBalanceOpt = Annotated[Optional[DocBalance], typer.Option(
    "--doc-balance", help="Documents to data-parallel ranks: stream (the default: in data order) or "
    "balanced (token- and attention-balanced); needs --seq-len-dist.")]
CpBucketsOpt = Annotated[Optional[bool], typer.Option(
    "--cp-buckets/--no-cp-buckets", help="Per-bucket context parallel: documents of at most "
    "seq-len/cp tokens train without CP, longer ones over the CP ranks (ByteScale); needs --seq-len-dist.")]
OverlapGradReduceOpt = Annotated[Optional[bool], typer.Option(
    "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Data-parallel gradient reduction overlapped "
    "with the backward (Megatron --overlap-grad-reduce) [default: on]; off: it runs after the backward, exposed.")]
ExpertSkewOpt = Annotated[Optional[float], typer.Option(
    "--expert-skew", help="MoE routing skew: expert e gets a share ~ (e+1)^-S (Zipf exponent S; 0 = uniform). "
    "Default: the calibration's imbalance. See docs/expert-load.md.")]
ExpertLoadOpt = Annotated[Optional[str], typer.Option(
    "--expert-load", help="MoE routing log (JSON lines, written by `meshplan train --expert-load-log`): the "
    "per-step, per-layer expert token counts the estimate places on the ep ranks.")]


@dataclass(frozen=True, kw_only=True)
class TrainingFlags:
    """The run: ``--seq-len``, ``--global-batch`` or ``--global-batch-tokens``, ``--precision``,
    ``--optimizer``. Left out, each comes from a Job file when there is one, else its default."""

    seq_len: SeqLenOpt = None
    global_batch: GlobalBatchOpt = None
    global_batch_tokens: GlobalBatchTokensOpt = None
    precision: PrecisionOpt = None
    recipe: RecipeOpt = None
    optimizer: OptimizerOpt = None
    moe_dispatcher: MoeDispatcherOpt = None
    moe_capacity_factor: MoeCapacityOpt = None
    seq_len_dist: SeqLenDistOpt = None
    doc_balance: DocBalanceOpt = None
    cp_buckets: CpBucketsOpt = None
    overlap_grad_reduce: OverlapGradReduceOpt = None
    expert_skew: ExpertSkewOpt = None
    expert_load: ExpertLoadOpt = None

    def with_data(self, training: TrainingSpec) -> TrainingSpec:
        """``training`` with the data flags given here (--seq-len-dist, --doc-balance, --cp-buckets)
        in place of its own."""
        dist = load_seq_len_dist(self.seq_len_dist) if self.seq_len_dist is not None else training.seq_len_dist
        return replace(
            training, seq_len_dist=dist,
            doc_balance=self.doc_balance if self.doc_balance is not None else training.doc_balance,
            cp_buckets=self.cp_buckets if self.cp_buckets is not None else training.cp_buckets)

    @property
    def length_or_batch_given(self) -> bool:
        return self.seq_len is not None or self.global_batch is not None or self.global_batch_tokens is not None

    def spec(self, job_training: TrainingSpec | None = None,
             default_precision: Precision = Precision.BF16) -> TrainingSpec:
        base = job_training
        global_batch = self.global_batch
        if base is not None and global_batch is None and self.global_batch_tokens is None:
            global_batch = base.global_batch
        precision = self.precision or (base.precision if base else default_precision)
        recipe = self.recipe
        if recipe is None and base is not None and precision == base.precision:
            recipe = base.recipe  # the Job file's recipe goes with its precision
        training = make_training(
            self.seq_len if self.seq_len is not None else (base.seq_len if base else DEFAULT_SEQ_LEN),
            global_batch, self.global_batch_tokens, precision,
            self.optimizer or (base.optimizer if base else Optimizer.ADAMW), recipe)
        dispatcher = self.moe_dispatcher or (base.moe_dispatcher if base else training.moe_dispatcher)
        capacity = self.moe_capacity_factor if self.moe_capacity_factor is not None else (
            base.moe_capacity_factor if base else None)
        training = replace(TrainingSpec.from_dict({**training.to_dict(), "moe_dispatcher": dispatcher.value,
                                                   "moe_capacity_factor": capacity}),
                           expert_load=self.expert_load_spec(base.expert_load if base else None))
        if base is not None:
            training = replace(training, seq_len_dist=base.seq_len_dist, doc_balance=base.doc_balance,
                               cp_buckets=base.cp_buckets)
        overlap = self.overlap_grad_reduce if self.overlap_grad_reduce is not None else (
            base.overlap_grad_reduce if base is not None else True)
        training = replace(training, overlap_grad_reduce=overlap)
        return self.with_data(training)

    def expert_load_spec(self, job_load: ExpertLoad | None = None) -> ExpertLoad | None:
        """--expert-skew or --expert-load (not both); else the Job file's expert load."""
        if self.expert_skew is not None and self.expert_load is not None:
            raise MeshplanError("give --expert-skew or --expert-load, not both")
        if self.expert_skew is not None:
            return zipf_load(self.expert_skew)
        if self.expert_load is not None:
            return read_expert_load(self.expert_load)
        return job_load
