"""Dry-run report: each simulated rank next to the cost model's estimate (no torch).

Memory: the rank's parameter, gradient and optimizer-state bytes (torch's tensors) and its tracked
peak against the cost model's breakdown for the rank's pipeline stage. Collectives: count and
bytes per group and kind against the cost model's (report.dryrun_expected). Differences that
follow from what each side counts are named in ``DIFFERENCE_NOTES`` (docs/dryrun.md explains them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table

from meshplan.cost import Calibration, calibration_for, estimate
from meshplan.plan import Job
from meshplan.report.dryrun_expected import expected_collectives, group_of
from meshplan.spec.cluster import GIB
PEAK_ORIGIN_ROWS = 10
"""Rows of the largest origins (category, module, op, dtype) at a rank's peak in the rendered report."""
DIFFERENCE_NOTES = (
    "parameters: the runtime keeps fp32 weights (4 B/param) as FSDP2's sharded master copy and computes "
    "with gathered 16-bit copies (MixedPrecisionPolicy); this row is the fp32 shards, the gathered copies "
    "are in the peak. The cost model counts a 16-bit working copy (2 B) and puts the fp32 master (4 B) "
    "with the optimizer states.",
    "peak: the tracker counts every tensor allocated through torch's dispatcher (weights, gradients, "
    "optimizer states, activations, FSDP's gathered weights, temporaries), not the allocator's "
    "fragmentation or the communication library's buffers; the cost model's peak is weights + gradients "
    "+ optimizer + activations kept for backward + its 'other' term.",
    "collective counts: the runtime issues one collective per FSDP unit (each layer and the root) and per "
    "tensor-parallel region; the cost model charges one bucket per step or layer pass, so compare bytes. "
    "FSDP gathers 16-bit weights and reduce-scatters fp32 gradients, as the cost model charges.",
    "activations: RMSNorm runs as CUDA's fused kernel would (reference path fused-norm-kernel: the 16-bit "
    "input and one fp32 value per row saved, where this CPU's composite keeps fp32 copies of the input); the "
    "cost model keeps 16-bit tensors (Korthikanti et al. 2022, 4.2.2).",
    "pipeline + FSDP: each stage keeps what its ZeRO stage keeps (pipeline.ZeroStage): zero 3 frees the "
    "gathered weights and reduce-scatters after every micro-batch's backward, zero 1 keeps both until the "
    "end of the step. The first stage receives no gradient and the last sends no activation.",
)


@dataclass(frozen=True)
class RankComparison:
    rank: int
    pp_rank: int
    measured: dict
    """The dry run's RankResult as a dict."""
    model_memory: dict[str, float]
    """The cost model's breakdown for this rank's pipeline stage, bytes."""
    collectives: list[dict]
    """Per (group, kind): dry-run count and bytes, cost-model count and bytes."""

    @property
    def peak_difference(self) -> float:
        """(dry-run peak - model peak) / model peak."""
        model = self.model_memory["total_bytes"]
        return (self.measured["peak_bytes"] - model) / model if model else 0.0

    @property
    def tensor_difference(self) -> float:
        """(dry-run peak - model's tensors) / model's tensors: like with like (see model_tensor_bytes)."""
        model = self.model_memory["tensor_bytes"]
        return (self.measured["peak_bytes"] - model) / model if model else 0.0

    def to_dict(self) -> dict:
        return {"rank": self.rank, "pp_rank": self.pp_rank, "dry_run": self.measured,
                "cost_model_memory": self.model_memory, "collectives": self.collectives,
                "peak_difference": self.peak_difference}


def model_tensor_bytes(mem, framework_bytes: float) -> float:
    """The cost model's peak less what no tensor tracker can see: the CUDA context, NCCL's buffers
    and workspace (Calibration.framework_overhead_gib) and the caching allocator's fragmentation
    reserve. What remains (weights, gradients, optimizer states, activations, logits, communication
    buckets, gathered ZeRO-3 layers) is what the dry run's MemTracker counts."""
    return mem.total_bytes - mem.reserve_bytes - framework_bytes


def compare(job: Job, results: list[dict], calib: Calibration | None = None) -> list[RankComparison]:
    """Each rank's dry run next to ``estimate()`` (with ``calib``, else the GPU's default stack)."""
    calib = calib or calibration_for(job.cluster.gpu)
    est = estimate(job.model, job.cluster, job.training, job.plan, calib)
    framework = calib.framework_overhead_gib * GIB
    out = []
    for res in results:
        pp_rank = res["coords"]["pp"]
        mem = est.stages[pp_rank].memory
        model_memory = {"parameters_bytes": mem.parameters_bytes, "gradients_bytes": mem.gradients_bytes,
                        "optimizer_bytes": mem.optimizer_bytes, "activations_bytes": mem.activations_bytes,
                        "other_bytes": mem.other_bytes, "total_bytes": mem.total_bytes,
                        "tensor_bytes": model_tensor_bytes(mem, framework),
                        "logits_bytes": mem.logits_bytes, "gathered_weight_bytes": mem.gathered_weight_bytes}
        out.append(RankComparison(rank=res["rank"], pp_rank=pp_rank, measured=res,
                                  model_memory=model_memory,
                                  collectives=_collective_rows(job, pp_rank, res["collectives"])))
    return out


def _collective_rows(job: Job, pp_rank: int, measured: list[dict]) -> list[dict]:
    rows: dict[tuple[str, str], dict] = defaultdict(
        lambda: {"count": 0, "bytes": 0, "model_count": 0.0, "model_bytes": 0.0, "axes": set()})
    for c in measured:
        kind = "send" if c["kind"] in ("send", "p2p") else c["kind"]
        if kind == "recv":
            continue  # every recv pairs with a send; the cost model charges the send
        row = rows[(group_of(c["axis"], kind), kind)]
        row["count"] += c["count"]
        row["bytes"] += c["total_bytes"]
        row["axes"].add(c["axis"])
    for e in expected_collectives(job, pp_rank):
        row = rows[(e.group, e.kind)]
        row["model_count"] += e.count
        row["model_bytes"] += e.total_bytes
    return [{"group": g, "kind": k, "axes": sorted(r["axes"]), "count": r["count"], "bytes": r["bytes"],
             "model_count": r["model_count"], "model_bytes": r["model_bytes"]}
            for (g, k), r in sorted(rows.items())]


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def _ratio(a: float, b: float) -> str:
    return f"{(a - b) / b:+.0%}" if b else ("-" if not a else "new")


def render(job: Job, comparisons: list[RankComparison]) -> Group:
    """Per simulated rank: a memory table and a collectives table, dry run next to the cost model."""
    plan = job.full_plan
    parts: list = [f"[bold]dry run: {job.model.name}  {plan.notation()}  ({plan.dims.world_size} ranks, "
                   f"fake process group)[/bold]"]
    for c in comparisons:
        r, m = c.measured, c.model_memory
        cat = r["peak_by_category"]
        transient = sum(v for k, v in cat.items() if k in ("Activation", "Temp", "Other", "Inputs"))
        mem = Table(title=f"rank {c.rank} (pp {c.pp_rank}, stages {r['stages']}): memory, GiB "
                          f"({r['steps']} steps, {r['microbatches']} micro-batches, {r['wall_s']:.0f} s)")
        for col in ("", "dry run", "cost model", "diff"):
            mem.add_column(col, justify="left" if not col else "right")
        rows = (("parameters", r["parameters_bytes"], m["parameters_bytes"]),
                ("gradients", r["gradients_bytes"], m["gradients_bytes"]),
                ("optimizer states", r["optimizer_bytes"], m["optimizer_bytes"]),
                ("activations + temporaries at peak", transient, m["activations_bytes"] + m["other_bytes"]),
                ("peak (tracker, allocated)", r["peak_bytes"], m["total_bytes"]),
                ("peak, model without CUDA context / NCCL / fragmentation", r["peak_bytes"],
                 m.get("tensor_bytes", m["total_bytes"])))
        for name, ours, theirs in rows:
            mem.add_row(name, _gib(ours), _gib(theirs), _ratio(ours, theirs))
        origins = r.get("peak_origins", [])[:PEAK_ORIGIN_ROWS]
        held = []
        if origins:
            table = Table(title=f"rank {c.rank}: largest tensors at the peak ({r.get('peak_at', '')}), "
                               "by what allocated them")
            for col in ("GiB", "category", "module (layers as *)", "op", "dtype"):
                table.add_column(col, justify="right" if col == "GiB" else "left")
            for o in origins:
                table.add_row(_gib(o["bytes"]), o["category"], o["module"], o["op"], o["dtype"])
            held = [table]
        coll = Table(title=f"rank {c.rank}: collectives per step")
        for col in ("group", "kind", "count", "model count", "GiB", "model GiB", "diff"):
            coll.add_column(col, justify="left" if col in ("group", "kind") else "right")
        for row in c.collectives:
            coll.add_row(row["group"], row["kind"], str(row["count"]), f"{row['model_count']:.0f}",
                         f"{row['bytes'] / GIB:.3f}", f"{row['model_bytes'] / GIB:.3f}",
                         _ratio(row["bytes"], row["model_bytes"]))
        parts += [mem, *held, coll]
    refs = sorted({p for c in comparisons for p in c.measured.get("reference_paths", [])})
    if refs:
        parts.append(f"[dim]reference paths (docs/dryrun.md): {', '.join(refs)}[/dim]")
    parts.extend(f"[dim]{note}[/dim]" for note in DIFFERENCE_NOTES)
    return Group(*parts)
