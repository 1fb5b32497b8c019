"""The DeviceMesh of a plan, with the flattened data-parallel views the runtime needs.

Axes in ``MESH_AXIS_ORDER`` (pp, dp_replicate, dp_shard, cp, tp), size-1 axes kept, so every rank
can slice any named axis. Flattened views (DeviceMesh._flatten, as torchtitan does):

- ``dp``           = dp_replicate x dp_shard: ranks that see different micro-batches (data loading).
- ``dp_shard_cp``  = dp_shard x cp: the FSDP shard group (context-parallel ranks hold the same
  weights and see different tokens, so their gradients are reduced together, as in torchtitan).
- ``dp_cp``        = dp_replicate x dp_shard x cp: every rank whose gradients are averaged.

Expert parallel reuses the dp_shard x cp ranks: :func:`build_ep_mesh` builds a second mesh that
splits them into (edp, ep), ep innermost, so rank ``s*cp + c`` is ``e_dp*ep + e``.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.plan import MESH_AXIS_ORDER, MeshAxis, Plan

AXIS_NAMES: tuple[str, ...] = tuple(a.value for a in MESH_AXIS_ORDER)


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """World mesh named after MeshAxis, plus the flattened dp, dp_shard_cp and dp_cp views."""
    mesh = init_device_mesh(device_type, plan.dims.mesh_shape, mesh_dim_names=AXIS_NAMES)
    mesh[(MeshAxis.DP_REPLICATE.value, MeshAxis.DP_SHARD.value)]._flatten("dp")
    mesh[(MeshAxis.DP_SHARD.value, MeshAxis.CP.value)]._flatten("dp_shard_cp")
    mesh[(MeshAxis.DP_REPLICATE.value, MeshAxis.DP_SHARD.value, MeshAxis.CP.value)]._flatten("dp_cp")
    return mesh


def data_parallel_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """Mesh for FSDP/HSDP: 2-D (dp_replicate, dp_shard_cp) when replicated, else 1-D dp_shard_cp."""
    if plan.dims.dp_replicate > 1:
        return mesh[("dp_replicate", "dp_shard_cp")]
    return mesh["dp_shard_cp"]


def build_ep_mesh(plan: Plan, device_type: str) -> DeviceMesh | None:
    """(pp, dp_replicate, edp, ep, tp) mesh for MoE expert parallel, or None when ep == 1."""
    d = plan.dims
    if d.ep == 1:
        return None
    edp = d.dp_shard * d.cp // d.ep
    mesh = init_device_mesh(device_type, (d.pp, d.dp_replicate, edp, d.ep, d.tp),
                            mesh_dim_names=("pp", "dp_replicate", "edp", "ep", "tp"))
    mesh[("dp_replicate", "edp")]._flatten("dp_edp")
    return mesh


def expert_data_parallel_mesh(ep_mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """Ranks holding the same experts: (dp_replicate, edp), 2-D when replicated."""
    if plan.dims.dp_replicate > 1:
        return ep_mesh[("dp_replicate", "edp")]
    return ep_mesh["edp"]
