"""A ``Plan``'s compact one-line form (``Plan.notation``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.plan.choices import CPMethod, ExpertPlacement, Recompute, Schedule
from meshplan.plan.split import format_counts

if TYPE_CHECKING:
    from meshplan.plan.core import Plan


def plan_notation(plan: "Plan") -> str:
    """Compact one-line form that maps one-to-one to the plan flags (``cli/plan_flags.py``),
    e.g. ``dp16 zero2x2 tp8sp pp4(interleaved-1f1b,v2) cp1 mb1 ckpt=sel:all``:

    ``dpN`` total data parallel (``--dp N``); ``zeroZxM`` / ``fsdpM`` ZeRO stage Z (3 = FSDP)
    sharded over M of those N ranks (``--zero Z --dp-shard M``; the other N/M replicate);
    ``tpT`` + ``sp`` when sequence parallel; ``ppP(schedule,vV)`` + ``vocab`` with vocabulary
    parallelism; ``cpC`` + ``a2a`` for
    all-to-all; ``epE`` + ``bal`` for a balanced expert placement, ``rR`` for R replica slots; ``mbB``; ``layers=...`` the layers per virtual stage when the split is
    not the even one; ``mtp=S`` the virtual stage of the MTP modules when not the last;
    ``ckpt=sel|full:all`` or ``:...`` the layers recomputed per stage when not all,
    ``sel(core_attn+moe_act)`` the modules selective recompute reruns when not the default
    attention core (``--recompute-modules``); ``offload=optimizer+params+activations`` what
    lives in host memory, ``:N`` the layers per rank whose activations do when not all;
    ``keep=attention+embedding`` the groups kept gathered under zero 3 and ``split=mlp4,head8``
    the operator splits when not 1 (OSDP).
    Lists are comma separated, a run of K equal counts N written ``NxK``.
    """
    d = plan.dims
    parts = [f"dp{d.dp}"]
    if plan.zero == 3:
        parts.append(f"fsdp{d.dp_shard}")
    elif plan.zero:
        parts.append(f"zero{plan.zero}x{d.dp_shard}")
    parts.append(f"tp{d.tp}{'sp' if plan.sp else ''}")
    pp = f"pp{d.pp}"
    if d.pp > 1 or plan.schedule != Schedule.ONE_F_ONE_B:
        pp += f"({plan.schedule.value}" + (f",v{plan.vpp}" if plan.vpp > 1 else "") + ")"
    parts.append(pp + ("vocab" if plan.vocab_parallel else ""))
    parts.append(f"cp{d.cp}" + ("a2a" if plan.cp_method == CPMethod.ALL_TO_ALL else ""))
    if d.ep > 1:
        parts.append(f"ep{d.ep}" + ("bal" if plan.expert_placement == ExpertPlacement.BALANCED else "")
                     + (f"r{plan.expert_replicas}" if plan.expert_replicas else ""))
    if d.etp and d.etp != d.tp:
        parts.append(f"etp{d.etp}")
    parts.append(f"mb{plan.micro_batch}")
    if plan.uneven_split:
        parts.append(f"layers={format_counts(plan.stage_layers)}")
    if plan.mtp_stage is not None:
        parts.append(f"mtp={plan.mtp_stage}")
    if plan.recompute != Recompute.NONE:
        short = {Recompute.SELECTIVE: "sel", Recompute.FULL: "full"}[plan.recompute]
        if plan.recompute_modules:
            short += "(" + "+".join(m.value for m in plan.recompute_modules) + ")"
        parts.append(f"ckpt={short}:{format_counts(plan.recompute_layers) if plan.partial_recompute else 'all'}")
    if plan.offload:
        parts.append("offload=" + "+".join(o.value for o in plan.offload)
                     + (f":{plan.offload_layers}" if plan.offload_layers else ""))
    if plan.keep_gathered:
        parts.append("keep=" + "+".join(g.value for g in plan.keep_gathered))
    splits = [f"{name}{n}" for name, n in (("mlp", plan.mlp_splits), ("head", plan.head_splits)) if n > 1]
    if splits:
        parts.append("split=" + ",".join(splits))
    return " ".join(parts)
