"""OSDP parity on CPU (issue 17.2): FSDP2 units per operator group with their reshard policy, MLPs
in slices and a chunked LM head + loss train to the same losses and weights as one process.

What a CPU-only run cannot show: the memory OSDP saves (one MLP slice gathered at a time, one
chunk of logits at a time) and the time its extra collectives and smaller GEMMs cost; those are
the cost model's (meshplan.cost.osdp), to be measured on a GPU. The test proves the units are
built with their policies, the slices and chunks compute the whole operator's function, and the
gradients of every slice and chunk reach the right parameters.
"""

from __future__ import annotations

import pytest

from meshplan.errors import MeshplanError
from meshplan.runtime.testing import parity_errors
from meshplan.targets import Target, check_runs

from _configs import layout_runs, make_job

pytestmark = pytest.mark.runtime

LAYOUTS = {
    # attention and the LM head kept gathered, each MLP in 2 slices, the loss over 4 token chunks
    "fsdp2_keep_split_chunk": ("llama", dict(dims=dict(dp_shard=2), zero=3, micro_batch=2,
                                             keep_gathered=("attention", "head"), mlp_splits=2, head_splits=4)),
    # GPT-2 (biases, tied head): MLP kept, embedding kept (tied: stays in the root), 2 chunks
    "fsdp2_keep_mlp_tied": ("gpt", dict(dims=dict(dp_shard=2), zero=3, keep_gathered=("mlp", "embedding"),
                                        head_splits=2)),
    # MoE: the whole MoE block (router, experts) kept as one unit beside the attention
    "fsdp2_moe_keep": ("moe", dict(dims=dict(dp_shard=2), zero=3, keep_gathered=("mlp",), head_splits=2)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(LAYOUTS, tmp_path_factory, "osdp")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_osdp_matches_one_process(runs, name):
    got, ref = runs[name]
    assert parity_errors(got, ref) == []


def test_runtime_refuses_chunked_head_with_tp():
    job = make_job("llama", dims=dict(tp=2), head_splits=2)
    with pytest.raises(MeshplanError, match="head_splits=2 with tp=2"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)


def test_runtime_refuses_mlp_slices_with_tp():
    job = make_job("llama", dims=dict(tp=2), zero=3, mlp_splits=2)
    with pytest.raises(MeshplanError, match="mlp_splits=2 with tp=2"):
        check_runs(Target.MESHPLAN, job.model, job.training, job.plan)


def test_units_and_their_reshard_policy():
    """Under zero 3: a kept group is a unit that stays gathered, each MLP slice a unit that
    reshards; a tied embedding stays in the root; nothing below zero 3."""
    from meshplan.plan import Plan, ParallelDims
    from meshplan.runtime.models import build_model
    from meshplan.runtime.osdp import SlicedMLP, apply_osdp_modules, osdp_units

    from _configs import MODELS

    plan = Plan(dims=ParallelDims(dp_shard=2), zero=3, keep_gathered=("attention", "head"), mlp_splits=2)
    model = build_model(MODELS["llama"])
    apply_osdp_modules(model, plan)
    units = osdp_units(model, plan)
    layer = model.layers["0"]
    assert isinstance(layer.feed_forward, SlicedMLP)
    assert (layer.attention, False) in units and (model.output, False) in units
    assert [(s, True) for s in layer.feed_forward.slices] == [u for u in units if u[0] in list(layer.feed_forward.slices)]
    assert len(units) == 2 * (1 + 2) + 1  # per layer attention + 2 slices; the head
    tied = build_model(MODELS["gpt"])
    kept = Plan(dims=ParallelDims(dp_shard=2), zero=3, keep_gathered=("embedding", "head"))
    assert osdp_units(tied, kept) == []  # the shared table stays in the root unit
    assert osdp_units(model, Plan(dims=ParallelDims(dp_shard=2), zero=2)) == []


def test_sliced_mlp_and_chunked_head_compute_the_whole_operators():
    """One process: k slices drawn by models.init from the whole MLP's tensors give its output and
    the chunked head its loss, gradients included."""
    import torch
    import torch.nn.functional as F

    from meshplan.runtime.models.init import init_parameters
    from meshplan.runtime.models.layers import MLP
    from meshplan.runtime.osdp import ChunkedLMHead, SlicedMLP

    whole = MLP(16, 48, gated=True, bias=True)
    init_parameters(whole, seed=3)
    sliced = SlicedMLP(MLP(16, 48, gated=True, bias=True), 3)
    init_parameters(sliced, seed=3)
    # the slices' canonical names are the whole MLP's: each slice holds its rows / columns
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(sliced(x), whole(x), rtol=1e-5, atol=1e-6)

    out = torch.nn.Linear(16, 40, bias=False)
    h = torch.randn(2, 6, 16, requires_grad=True)
    y = torch.randint(0, 40, (2, 6))
    ref = F.cross_entropy(out(h).flatten(0, 1), y.flatten(), reduction="sum")
    ref.backward()
    g_h, g_w = h.grad.clone(), out.weight.grad.clone()
    h.grad, out.weight.grad = None, None
    head = ChunkedLMHead(out, 4)
    with head.targets(y):
        loss = head(h)
    loss.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(h.grad, g_h)
    torch.testing.assert_close(out.weight.grad, g_w)


def test_hf_weights_fill_mlp_slices(tmp_path):
    """Hugging Face weights load into a model with MLP slices and a chunked head, and it gives
    transformers' logits: each slice reads its rows / columns of the whole tensors."""
    tf = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    import torch

    from meshplan.plan import ParallelDims, Plan
    from meshplan.runtime.hf_weights import load_hf_weights
    from meshplan.runtime.models import build_model
    from meshplan.runtime.osdp import apply_osdp_modules
    from meshplan.spec.hf import load_hf_config

    torch.manual_seed(0)
    theirs = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False)).eval()
    theirs.save_pretrained(tmp_path)
    spec = load_hf_config(tmp_path)
    ours = build_model(spec, "cpu")
    apply_osdp_modules(ours, Plan(dims=ParallelDims(dp_shard=2), zero=3, mlp_splits=4, head_splits=2))
    ours.init_weights(1)
    load_hf_weights([ours], tmp_path, spec)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, rtol=1e-5, atol=1e-5)
