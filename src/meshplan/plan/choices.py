"""The vocabulary of a plan: mesh axes, pipeline schedules, recompute, offload, operator groups,
expert placement and context-parallel methods (enums shared by planner and runtime)."""

from __future__ import annotations

import enum


class MeshAxis(str, enum.Enum):
    """Device-mesh axis names, shared by planner and runtime (DeviceMesh ``mesh_dim_names``)."""

    PP = "pp"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"
    CP = "cp"
    TP = "tp"


# Outermost first; the runtime builds its DeviceMesh in exactly this order.
MESH_AXIS_ORDER: tuple[MeshAxis, ...] = (
    MeshAxis.PP,
    MeshAxis.DP_REPLICATE,
    MeshAxis.DP_SHARD,
    MeshAxis.CP,
    MeshAxis.TP,
)


class Schedule(str, enum.Enum):
    """Pipeline schedules (torch.distributed.pipelining names in brackets)."""

    GPIPE = "gpipe"  # all forwards, then all backwards (ScheduleGPipe)
    ONE_F_ONE_B = "1f1b"  # PipeDream-flush (Schedule1F1B)
    INTERLEAVED_1F1B = "interleaved-1f1b"  # virtual stages (ScheduleInterleaved1F1B)
    ZERO_BUBBLE = "zero-bubble"  # split backward, B/W (ScheduleInterleavedZeroBubble)

    @property
    def supports_virtual_stages(self) -> bool:
        return self in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE)


class Recompute(str, enum.Enum):
    """Activation recomputation policy (Korthikanti et al. 2022, Sec. 4 and 5)."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute only the attention core (softmax, dropout, QK^T, AV)
    FULL = "full"  # keep only each layer's input; recompute the whole layer in backward


class RecomputeModule(str, enum.Enum):
    """The submodules Megatron-Core's selective recompute can recompute (``--recompute-modules``;
    ``TransformerConfig.recompute_modules``, megatron/core/transformer/transformer_config.py,
    NVIDIA/Megatron-LM@d30c3ae5469fe3f6a64d4fd2e63b6e7f7844ea81). A plan's empty set means
    Megatron's default, ``core_attn`` alone. ``core_attn``, ``mlp``, ``moe`` and
    ``shared_experts`` are checkpointed as a whole (their input kept); ``moe_act``, ``layernorm``
    and ``mla_up_proj`` discard their output after use and rerun to get it back."""

    CORE_ATTN = "core_attn"  # the attention core: QK^T, softmax, dropout, AV (Korthikanti et al. 2022 Sec. 5)
    MLP = "mlp"  # the dense MLP of a dense layer
    MOE = "moe"  # the whole MoE block: router, dispatch, experts, combine, shared experts
    MOE_ACT = "moe_act"  # the routed experts' activation function (its output: fc2's input)
    LAYERNORM = "layernorm"  # input_layernorm and pre_mlp_layernorm (their outputs)
    MLA_UP_PROJ = "mla_up_proj"  # MLA's q and kv up projections and RoPE (their outputs)
    SHARED_EXPERTS = "shared_experts"  # the MoE block's shared experts

    @property
    def bit(self) -> int:
        """Bit of this module in the search's integer column (``PlanArrays.recompute_modules``)."""
        return 1 << tuple(RecomputeModule).index(self)


def recompute_module_code(modules: "tuple[RecomputeModule, ...]") -> int:
    """The bit mask of a set of recomputed modules; 0 for Megatron's default (``core_attn`` alone,
    also written as the empty set), so that one set has one code."""
    chosen = {RecomputeModule(m) for m in modules}
    return 0 if chosen <= {RecomputeModule.CORE_ATTN} else sum(m.bit for m in chosen)


def recompute_module_choices(code: int) -> "tuple[RecomputeModule, ...]":
    """The inverse of :func:`recompute_module_code` (0: the empty set, Megatron's default)."""
    return tuple(m for m in RecomputeModule if code & m.bit)


class Offload(str, enum.Enum):
    """What lives in host memory instead of the GPU's (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity,
    Rajbhandari et al. 2021). ``PARAMS`` moves the parameter and gradient shards (and needs
    ``OPTIMIZER``: the step then runs on the host, where both are); ``ACTIVATIONS`` moves the tensors
    saved for backward (torch's ``save_on_cpu``)."""

    OPTIMIZER = "optimizer"
    PARAMS = "params"
    ACTIVATIONS = "activations"

    @property
    def bit(self) -> int:
        """Bit of this choice in the search's integer column (``PlanArrays.offload``)."""
        return 1 << tuple(Offload).index(self)


OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT, OFFLOAD_ACTIVATIONS_BIT = (o.bit for o in Offload)


def offload_code(choices: "tuple[Offload, ...]") -> int:
    """The bit mask of a set of offload choices (0: nothing offloaded)."""
    return sum(Offload(c).bit for c in set(choices))


def offload_choices(code: int) -> "tuple[Offload, ...]":
    """The inverse of :func:`offload_code`, in the enum's order."""
    return tuple(o for o in Offload if code & o.bit)


class OpGroup(str, enum.Enum):
    """Operator groups whose parameters OSDP shards or keeps as one (Jiang et al. 2023, "OSDP:
    Optimal Sharded Data Parallel for Distributed Deep Learning", Sec. 3: a per-operator choice
    between ZeRO-3 sharding and ZeRO-DP's gathered parameters; here per group of operators)."""

    ATTENTION = "attention"  # every layer's attention (and its norm)
    MLP = "mlp"  # every layer's MLP, or its experts and shared experts
    EMBEDDING = "embedding"
    HEAD = "head"  # final norm and LM head

    @property
    def bit(self) -> int:
        """Bit of this group in the search's integer column (``PlanArrays.keep``)."""
        return 1 << tuple(OpGroup).index(self)


def group_code(groups: "tuple[OpGroup, ...]") -> int:
    """The bit mask of a set of operator groups (0: none)."""
    return sum(OpGroup(g).bit for g in set(groups))


def group_choices(code: int) -> "tuple[OpGroup, ...]":
    """The inverse of :func:`group_code`, in the enum's order."""
    return tuple(g for g in OpGroup if code & g.bit)
class ExpertPlacement(str, enum.Enum):
    """Which expert-parallel rank holds which routed expert (meshplan.cost.expert_load)."""

    CONTIGUOUS = "contiguous"  # rank r holds experts [r*E/ep, (r+1)*E/ep) (Megatron-Core, the runtime)
    BALANCED = "balanced"  # greedy by the expert load, E/ep per rank (FlexMoE, Nie et al. 2023 Sec. 4)


class CPMethod(str, enum.Enum):
    """Context-parallel attention: ring (pass K/V around) or all-to-all (Ulysses, heads <-> seq)."""

    RING = "ring"
    ALL_TO_ALL = "all-to-all"
