"""Every efficiency, overlap and overhead factor of the cost model, with its source.

The formulas in :mod:`meshplan.cost` only ever read factors from a :class:`Calibration`; no bare
tuning numbers appear inside a formula. A training stack is a named calibration (issue 14, item
6): ``calibration_for(gpu, stack)`` layers the literature defaults, the stack's mechanisms (what
it overlaps, its fixed host costs: ``STACK_FIELDS``, each stack's with its source) and the values
fitted on published runs for the (GPU generation, stack) pair, all kept as data with their
source (``FITTED_FILE``; ``meshplan validate --fit --write-calibration --out PATH`` writes a refit).
Loading that file is :mod:`meshplan.cost.calib_records`'s, the order in which its parts apply
:mod:`meshplan.cost.stack_resolution`'s; this module keeps the dataclass, its range checks and
``calibration_for``. The fields themselves are documented by group in :mod:`meshplan.cost.calib_fields`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping

from meshplan.cost.attention_kernels import check_kernel
from meshplan.cost.calib_fields import (CommFields, ComputeFields, LongContextFields, MechanismFields, MemoryFields,
                                        MoEFields, PrecisionFields)
from meshplan.cost.calib_records import (DEFAULT_STACK, FITTED_FILE, FittedRecord, StackRecord, gpu_family,
                                         gpu_generation, lender_keys, read_fitted_records, read_stack_records,
                                         record_key)
from meshplan.cost.generation_transfer import generation_transfers
from meshplan.cost.stack_resolution import resolve_calibration
from meshplan.errors import MeshplanError
from meshplan.spec.cluster import GPUSpec
from meshplan.spec.training import Precision

__all__ = [  # the data file's names stay importable from here (cost/calib_records.py)
    "DEFAULT_STACK", "FITTED_FILE", "STACK_FIELDS", "Calibration", "FittedRecord", "StackRecord", "calibration_for",
    "fitted_records", "gpu_family", "gpu_generation", "record_key", "stack_names", "stack_records",
]


@dataclass(frozen=True, kw_only=True)
class _SourceField:
    source: str = "defaults"
    """Free text: 'defaults', 'fitted on runs_calibration.csv', 'hardware profile ...'."""


# A dataclass collects its fields from the bases in reverse MRO order, so the groups are listed last
# first: fields(Calibration) (hence asdict, to_dict and the JSON written from it) keeps the order
# source, compute, precision, long context, MoE, communication, memory, mechanisms.
@dataclass(frozen=True, kw_only=True)
class Calibration(MechanismFields, MemoryFields, CommFields, MoEFields, LongContextFields, PrecisionFields,
                  ComputeFields, _SourceField):
    """Named factors of the cost model. ``source`` says where the values came from."""

    # ---- behaviour ------------------------------------------------------------------------
    def grad_bytes_per_param(self, precision: Precision) -> float:
        """Bytes of one gradient element for this compute precision (fp32 training: 4)."""
        if precision == Precision.FP16:
            return self.grad_bytes_per_param_fp16
        if precision == Precision.FP32:
            return 4.0
        return self.grad_bytes_per_param_bf16

    def collective_factors(self, op: str) -> tuple[float, float]:
        """(latency factor, bandwidth factor) of a collective op ('all_reduce', 'all_gather',
        'reduce_scatter', 'all_to_all', 'send_recv', 'tp_all_gather', 'tp_reduce_scatter'; the
        names of meshplan.calib.hwfit.CollectiveOp)."""
        if not hasattr(self, f"{op}_latency_factor"):
            raise MeshplanError(f"unknown collective {op!r}")
        return getattr(self, f"{op}_latency_factor"), getattr(self, f"{op}_bandwidth_factor")

    def replace_fields(self, **changes: Any) -> "Calibration":
        known = {f.name for f in fields(self)}
        extra = set(changes) - known
        if extra:
            raise MeshplanError(f"unknown calibration field(s): {', '.join(sorted(extra))}")
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Calibration":
        if not isinstance(data, dict):
            raise MeshplanError("calibration must be a mapping")
        return cls().replace_fields(**data)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("source", "attention_kernel") or isinstance(v, bool):
                continue
            if not isinstance(v, (int, float)) or v < 0:
                raise MeshplanError(f"calibration {f.name} must be a non-negative number, got {v!r}")
        check_kernel(self.attention_kernel)
        for share in ("attention_exp_share", "attention_backward_exp_share"):
            if getattr(self, share) > 1:
                raise MeshplanError(f"calibration {share} must be a share in [0, 1], got {getattr(self, share)!r}")
        if self.fp8_matmul_factor <= 0 or self.fp4_matmul_factor <= 0:
            raise MeshplanError("calibration fp8_matmul_factor and fp4_matmul_factor must be > 0")
        if self.moe_routing_imbalance < 1:
            raise MeshplanError(f"calibration moe_routing_imbalance must be >= 1, got {self.moe_routing_imbalance!r}")
        for f in ("matmul_efficiency", "attention_efficiency", "hbm_efficiency",
                  "intra_node_comm_efficiency", "inter_node_comm_efficiency", "moe_grouped_gemm_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise MeshplanError(f"calibration {f} must be in (0, 1], got {getattr(self, f)!r}")
        for f in (f.name for f in fields(self) if f.name.endswith("_bandwidth_factor")):
            if not getattr(self, f) > 0:
                raise MeshplanError(f"calibration {f} must be > 0, got {getattr(self, f)!r}")
        for f in ("tp_overlap", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap",
                  "pp_p2p_overlap", "zero_bubble_residual", "unaligned_matmul_factor",
                  "fp8_matmul_factor", "fp4_matmul_factor", "ring_nic_spread",
                  "moe_dispatch_nvlink_efficiency"):
            if not 0 <= getattr(self, f) <= 1:
                raise MeshplanError(f"calibration {f} must be in [0, 1], got {getattr(self, f)!r}")


STACK_FIELDS = ("tp_overlap", "tp_backward_async", "dp_overlap", "fsdp_overlap", "cp_overlap", "ep_overlap",
                "pp_p2p_overlap", "zero_bubble_residual", "layer_overhead_s", "layer_overhead_on_host",
                "microbatch_overhead_s",
                "loss_transient_bytes_per_element", "host_s_per_kernel", "host_kernels_by_op", "host_fused_kernels", "eager_memory_passes",
                "repeat_kv_copy",
                "logits_bytes_per_element",
                "fsdp_pp_keeps_unsharded", "fsdp_pp_accumulates_unsharded_grads", "zero_bubble_keeps_unsharded",
                "op_selective_recompute",
                "fp8_weight_copy_bytes_per_param", "fp8_saved_input_bytes_per_element", "fp8_param_gather",
                "fp8_tp_all_gather",
                "attention_kernel",
                "pp_preallocated_recv_buffers", "pp_kept_output_bytes_per_element", "cuda_graph_full_iteration", "moe_fused_grouped_mlp",
                "allocator_expandable_segments", "cp_ring_gathers_kv", "fp16_step_grad_copy_bytes_per_param",
                "fp16_zero_step_grad_copy_bytes_per_param", "sp_saves_gathered_inputs",
                "loss_parallel_transient_bytes_per_element", "params_are_master",
                "zero3_max_live_params", "zero3_prefetch_bucket_params", "fsdp_reduce_scatter_bytes_per_param",
                "fsdp_root_gathered_in_backward", "cp_ring_score_tile_rows", "cp_ring_backward_live_tiles")
"""Fields that describe how a stack runs a plan (what it overlaps, its host work), not the
hardware: never borrowed from another stack's record."""


@lru_cache(maxsize=1)
def fitted_records() -> Mapping[str, FittedRecord]:
    """The fitted records by 'generation/stack' (``FITTED_FILE``), each checked against Calibration."""
    out = read_fitted_records()
    for record in out.values():
        Calibration().replace_fields(**record.values)  # an unknown field or a bad value fails here
    return MappingProxyType(out)


@lru_cache(maxsize=1)
def stack_records() -> Mapping[str, StackRecord]:
    """Each stack's mechanisms (``FITTED_FILE`` 'stacks'), checked against Calibration."""
    out = read_stack_records()
    for stack, record in out.items():
        bad = set(record.values) - set(STACK_FIELDS)
        if bad:
            raise MeshplanError(f"{FITTED_FILE}: stack {stack}: not stack fields: {', '.join(sorted(bad))}")
        Calibration().replace_fields(**record.values)
    return MappingProxyType(out)


def stack_names() -> tuple[str, ...]:
    return tuple(stack_records())


def calibration_for(gpu: GPUSpec, stack: str | None = None) -> Calibration:
    """The calibration of ``stack`` (default: meshplan's runtime) on ``gpu``'s generation:
    defaults, then, when this pair has no record, the hardware fields of a record borrowed from
    another stack of the same generation (else the GEMM fields carried from another generation's
    record, cost/generation_transfer.py), then the attention efficiency of the stack's kernel on
    this generation (cost/attention_kernels.py; the fit's start too), then the stack's
    mechanisms, then the pair's own record (cost/stack_resolution.py)."""
    resolved = resolve_calibration(gpu_generation(gpu), (stack or DEFAULT_STACK).lower(), fitted=fitted_records(),
                                   stacks=stack_records(), lenders=lender_keys(), stack_fields=STACK_FIELDS,
                                   default_kernel=Calibration().attention_kernel, transfers=generation_transfers())
    return Calibration().replace_fields(**{**resolved.values, "source": resolved.source})
