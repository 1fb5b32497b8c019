"""The plan flags (``--dp --dp-shard --tp --pp --cp --ep --zero --micro-batch --recompute
--schedule --vpp --sp/--no-sp --cp-method --stage-layers --recompute-layers --recompute-modules --offload
--offload-layers --keep-gathered --mlp-splits --head-splits --expert-placement --expert-replicas``): declared once,
turned into a Plan in one place (:func:`build_plan`), and back (:func:`flags_for`): the flags that
reproduce a plan, in the same terms as its notation (``Plan.notation``)."""

from __future__ import annotations

import dataclasses
import enum
import shlex
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from meshplan.errors import MeshplanError
from meshplan.plan import (CPMethod, ExpertPlacement, Offload, OpGroup, ParallelDims, Plan, Recompute,
                           RecomputeModule, Schedule,
                           data_parallel_degree,
                           format_counts, format_layout, looks_like_layout, parse_counts, parse_layout)

Int = Optional[int]


@dataclass(frozen=True, kw_only=True)
class PlanFlags:
    """How to parallelise, as flags (``@with_flags(plan_flags=PlanFlags)``)."""

    dp: Annotated[Int, typer.Option("--dp", help="Data-parallel degree, replicated x sharded (default: GPUs / (tp*pp*cp)).")] = None
    dp_shard: Annotated[Int, typer.Option("--dp-shard", help="Sharded part of --dp (HSDP); default all of it when --zero > 0.")] = None
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")] = 1
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree.")] = 1
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")] = 1
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage over the sharded data-parallel ranks (3 = FSDP).")] = 0
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1
    recompute: Annotated[Recompute, typer.Option("--recompute", help="Activation recomputation.")] = Recompute.NONE
    schedule: Annotated[Schedule, typer.Option("--schedule", help="Pipeline schedule.")] = Schedule.ONE_F_ONE_B
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per rank (implies --schedule interleaved-1f1b when 1f1b).")] = 1
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallel (default: on when tp > 1).")] = None
    cp_method: Annotated[CPMethod, typer.Option("--cp-method", help="Context-parallel attention.")] = CPMethod.RING
    stage_layers: Annotated[Optional[str], typer.Option("--stage-layers", help="Layers per (virtual) pipeline stage in model order, e.g. 9,10x6,11 (NxK: K stages of N), or a Megatron layout such as 'Et*4|(t*4|)*14tmL' (m: the MTP modules' stage); default an even split.")] = None
    recompute_layers: Annotated[Optional[str], typer.Option("--recompute-layers", help="Layers recomputed per (virtual) stage under --recompute, e.g. 2x4,0x4; default all.")] = None
    recompute_modules: Annotated[Optional[str], typer.Option("--recompute-modules", help="With --recompute selective, the modules recomputed (Megatron-Core's --recompute-modules): core_attn, mlp, moe, moe_act, layernorm, mla_up_proj, shared_experts; '+'-separated, default core_attn.")] = None
    vocab_parallel: Annotated[bool, typer.Option("--vocab-parallel/--no-vocab-parallel", help="Split the embedding and LM head over the pipeline ranks (needs --pp > 1).")] = False
    expert_placement: Annotated[ExpertPlacement, typer.Option("--expert-placement", help="Which ep rank holds which expert: contiguous ids, or balanced by the expert load (--expert-skew / --expert-load).")] = ExpertPlacement.CONTIGUOUS
    expert_replicas: Annotated[int, typer.Option("--expert-replicas", help="Extra slots per ep rank for copies of the hottest experts (FlexMoE).")] = 0
    offload: Annotated[Optional[str], typer.Option("--offload", help="Keep in host memory: optimizer, params (needs optimizer and --zero 3), activations; '+'-separated, e.g. optimizer+activations.")] = None
    offload_layers: Annotated[int, typer.Option("--offload-layers", help="With --offload activations, the layers per pipeline rank whose activations go to the host (Megatron's cpu_offloading_num_layers); 0: all.")] = 0
    keep_gathered: Annotated[Optional[str], typer.Option("--keep-gathered", help="With --zero 3, operator groups kept gathered from forward to backward (OSDP): attention, mlp, embedding, head; '+'-separated.")] = None
    mlp_splits: Annotated[int, typer.Option("--mlp-splits", help="With --zero 3, gather each MLP's weights in this many slices (OSDP operator splitting).")] = 1
    head_splits: Annotated[int, typer.Option("--head-splits", help="Run the LM head and loss on this many token chunks (no full logits tensor).")] = 1

    @property
    def given(self) -> bool:
        """Whether any plan flag differs from its default."""
        return self != PlanFlags()

    def argv(self) -> list[str]:
        """The command-line flags, only those that differ from their default (``--dp`` whenever set)."""
        defaults = PlanFlags()
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name != "dp" and value == getattr(defaults, f.name)):
                continue
            if f.name == "sp":
                out.append("--sp" if value else "--no-sp")
                continue
            if f.name == "vocab_parallel":
                out.append("--vocab-parallel")
                continue
            out += [f"--{f.name.replace('_', '-')}", str(value.value if isinstance(value, enum.Enum) else value)]
        return out


def build_plan(num_gpus: int, flags: PlanFlags) -> Plan:
    """Plan from the flags. ``dp`` is the total data-parallel degree (derived from the GPU count
    when left out); with ``zero > 0`` it is sharded (``dp_shard = dp``) unless ``dp_shard`` is
    given, in which case ``dp_replicate = dp / dp_shard`` (HSDP)."""
    f = flags
    for name, v in (("tp", f.tp), ("pp", f.pp), ("cp", f.cp), ("ep", f.ep), ("vpp", f.vpp),
                    ("micro-batch", f.micro_batch), ("dp", f.dp), ("dp-shard", f.dp_shard),
                    ("mlp-splits", f.mlp_splits), ("head-splits", f.head_splits)):
        if v is not None and v < 1:
            raise MeshplanError(f"--{name} must be a positive integer, got {v}")
    dp = f.dp
    if dp is None:
        dp = data_parallel_degree(num_gpus, tp=f.tp, pp=f.pp, cp=f.cp)
    dp_shard = f.dp_shard
    if dp_shard is None:
        dp_shard = dp if f.zero > 0 else 1
    if dp % dp_shard:
        raise MeshplanError(f"--dp {dp} is not divisible by --dp-shard {dp_shard}")
    schedule = f.schedule
    if schedule == Schedule.ONE_F_ONE_B and f.vpp > 1:
        schedule = Schedule.INTERLEAVED_1F1B
    return Plan(
        dims=ParallelDims(dp_replicate=dp // dp_shard, dp_shard=dp_shard, tp=f.tp, pp=f.pp, cp=f.cp, ep=f.ep),
        zero=f.zero, sp=(f.tp > 1) if f.sp is None else f.sp, schedule=schedule, vpp=f.vpp,
        cp_method=f.cp_method, micro_batch=f.micro_batch, recompute=f.recompute,
        **_stage_fields(f.stage_layers, f.pp * f.vpp),
        recompute_layers=(parse_counts(f.recompute_layers, "--recompute-layers", max_entries=f.pp * f.vpp)
                          if f.recompute_layers else ()),
        recompute_modules=_parse_names(f.recompute_modules, RecomputeModule, "--recompute-modules"),
        offload=_parse_names(f.offload, Offload, "--offload"), offload_layers=f.offload_layers,
        vocab_parallel=f.vocab_parallel,
        keep_gathered=_parse_names(f.keep_gathered, OpGroup, "--keep-gathered"),
        mlp_splits=f.mlp_splits, head_splits=f.head_splits,
        expert_placement=f.expert_placement, expert_replicas=f.expert_replicas,
    )


def _stage_fields(text: str | None, num_stages: int) -> dict:
    """``--stage-layers``: counts (``4x15,1``) or a Megatron layout string (``Et*4|(t*4|)*14tmL``,
    meshplan.plan.layout), which also says where the MTP modules sit."""
    if not text:
        return {"stage_layers": ()}
    if not looks_like_layout(text):
        return {"stage_layers": parse_counts(text, "--stage-layers", max_entries=num_stages)}
    try:
        layout = parse_layout(text)
    except MeshplanError as exc:
        raise MeshplanError(f"--stage-layers: {exc}") from None
    return {"stage_layers": layout.stage_layers, "mtp_stage": layout.mtp_stage}


def _parse_names(text: str | None, enum_cls: type[enum.Enum], flag: str) -> tuple:
    """'+'-separated members of ``enum_cls`` by value (``--offload``, ``--keep-gathered``)."""
    if not text:
        return ()
    names = [t.strip() for t in text.split("+")]
    known = {o.value: o for o in enum_cls}
    bad = [n for n in names if n not in known]
    if bad:
        raise MeshplanError(f"{flag} {text!r}: {bad[0]!r} is not one of {', '.join(known)}")
    return tuple(known[n] for n in names)


def flags_for(plan: Plan) -> PlanFlags:
    """The flags that :func:`build_plan` turns back into ``plan`` (the same plan once both have
    their defaults filled in by ``Plan.with_defaults``): the inverse of build_plan."""
    d = plan.dims
    implied_schedule = Schedule.INTERLEAVED_1F1B if plan.vpp > 1 else Schedule.ONE_F_ONE_B
    return PlanFlags(
        dp=d.dp, dp_shard=d.dp_shard if plan.zero and d.dp_shard != d.dp else None,
        tp=d.tp, pp=d.pp, cp=d.cp, ep=d.ep, zero=plan.zero, micro_batch=plan.micro_batch,
        recompute=plan.recompute,
        schedule=plan.schedule if plan.schedule != implied_schedule else Schedule.ONE_F_ONE_B,
        vpp=plan.vpp, sp=None if plan.sp == (d.tp > 1) else plan.sp, cp_method=plan.cp_method,
        stage_layers=(format_layout(plan.stage_layers, mtp_layers=1, mtp_stage=plan.mtp_stage)
                      if plan.mtp_stage is not None else
                      format_counts(plan.stage_layers) if plan.uneven_split else None),
        recompute_layers=(format_counts(plan.recompute_layers)
                          if plan.recompute != Recompute.NONE and plan.partial_recompute else None),
        recompute_modules="+".join(m.value for m in plan.recompute_modules) or None,
        offload="+".join(o.value for o in plan.offload) or None, offload_layers=plan.offload_layers,
        vocab_parallel=plan.vocab_parallel,
        keep_gathered="+".join(g.value for g in plan.keep_gathered) or None,
        mlp_splits=plan.mlp_splits, head_splits=plan.head_splits,
        expert_placement=plan.expert_placement, expert_replicas=plan.expert_replicas,
    )


def plan_argv(plan: Plan) -> str:
    """``flags_for(plan)`` as one command-line string, e.g. ``--dp 32 --dp-shard 2 --zero 2 --tp 2``
    (shell-quoted: a Megatron layout's ``|`` and ``*`` reach the flag, not the shell)."""
    return shlex.join(flags_for(plan).argv())
