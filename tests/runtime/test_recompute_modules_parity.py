"""Selective recompute of named modules in the runtime (Plan.recompute_modules; runtime/parallelize.py
``apply_ac``): the dense MLP and the MoE block checkpointed whole train to the same losses and
weights as the one-process run without recompute (CPU, gloo)."""

from __future__ import annotations

import pytest

from meshplan.plan import RecomputeModule as M
from meshplan.runtime.testing import parity_errors

from _configs import STEPS, layout_runs

pytestmark = pytest.mark.runtime

LAYOUTS = {
    "llama_dp2_mlp": ("llama", dict(dims=dict(dp_replicate=2), recompute="selective", recompute_modules=(M.MLP,))),
    "llama_tp2_sp_core_attn_mlp": ("llama", dict(dims=dict(tp=2), sp=True, recompute="selective",
                                                 recompute_modules=(M.CORE_ATTN, M.MLP))),
    "moe_ep2_moe": ("moe", dict(dims=dict(dp_shard=2, ep=2), zero=1, recompute="selective",
                                recompute_modules=(M.CORE_ATTN, M.MOE))),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(LAYOUTS, tmp_path_factory, "recmod")


@pytest.mark.parametrize("name", LAYOUTS)
def test_module_recompute_parity(name, runs):
    got, ref = runs[name]
    assert len(got.losses) == STEPS
    errors = parity_errors(got, ref)
    assert not errors, f"{name}: " + "; ".join(errors[:5])


def test_apply_ac_checkpoints_exactly_the_named_modules():
    """The parity above is not vacuous: the named submodules carry a checkpoint, the others not."""
    from torch.distributed._composable import checkpoint

    from meshplan.plan import Plan
    from meshplan.runtime.models.transformer import Transformer
    from meshplan.runtime.parallelize import apply_ac

    from _configs import MODELS

    def marked(model_name, modules):
        model = Transformer(MODELS[model_name])
        plan = Plan(recompute="selective", recompute_modules=modules).with_defaults(MODELS[model_name])
        apply_ac(model, plan)
        layer = model.layers["1"]
        ffn = layer.moe if layer.moe is not None else layer.feed_forward
        core = layer.attention.core
        return (checkpoint.state(getattr(core, "inner", core)) is not None, checkpoint.state(ffn) is not None)

    assert marked("llama", ()) == (True, False)
    assert marked("llama", (M.MLP,)) == (False, True)
    assert marked("moe", (M.CORE_ATTN, M.MOE)) == (True, True)
    assert marked("moe", (M.MLP,)) == (False, False)  # layer 1 of toy-moe holds experts, no dense MLP
