"""Published rows become real models and plans: alias table, framework defaults (issue 13.5),
and the plan-space pieces those rows need (etp, embedding/loss stages; issue 13.4)."""

import pytest
from hypothesis import given, settings, strategies as st

from meshplan.cost import estimate
from meshplan.calib.validate import build_run, evaluate
from meshplan.errors import MeshplanError
from meshplan.plan import ParallelDims, Plan, embedding_loss_split
from meshplan.spec.aliases import normalise, resolve_alias
from meshplan.spec.cluster import system_preset
from meshplan.spec.frameworks import framework_defaults, framework_names
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Recipe, TrainingSpec

ROW = dict(id="7", source="Megatron-Bridge 26.08", model="LLAMA3_70B", num_layers="80", hidden_size="8192",
           num_heads="64", num_kv_heads="8", ffn_hidden_size="28672", seq_len="8192", gpu="gb300",
           num_gpus="64", gpus_per_node="8", global_batch_size="256", micro_batch_size="1", tp="2",
           pp="4", dp="8", cp="1", ep="1", vpp="5", precision="fp8", measured_tflops_per_gpu="1500",
           flops_basis="model", framework="megatron-core")


def test_alias_table_names_presets():
    assert normalise("  LLAMA3.1_405B ") == "llama3.1 405b" == normalise("llama3.1-405B")
    assert resolve_alias("LLAMA3_70B").preset == "llama3-70b"
    assert resolve_alias("llama3 70b").preset == "llama3-70b"
    assert resolve_alias("DeepSeekV3 (w/o MTP)").preset == "deepseek-v3-nomtp"
    assert "token-drop" in resolve_alias("Qwen3_30B_a3B (tokendrop)").note
    assert resolve_alias("GPT 1.7B") is None  # the 2020-22 runs keep their own dimensions


def test_megatron_core_row_builds_the_preset_with_listed_defaults():
    run = build_run(ROW)
    assert run.model == model_preset("llama3-70b")
    assert run.cluster.scale_up_gpus == 72 and run.cluster.gpu.name == "gb300"
    assert run.training.recipe == Recipe.MXFP8  # Blackwell: fp8_mx
    assert run.plan.zero == 1 and run.plan.dims.dp_shard == 8 and run.plan.sp
    assert run.settings == {"fused_attention": True, "dropout": False, "activation_offload_overlap": 1.0,
                            "grad_bytes_per_param_bf16": 2.0, "fp8_param_gather": True,
                            "moe_routed_copies_kept": 1.0}
    text = " | ".join(run.assumed)
    for part in ("preset llama3-70b", "mxfp8", "zero: 1", "sequence_parallel: 1", "recompute: none"):
        assert part in text
    h100 = build_run({**ROW, "gpu": "h100-sxm", "precision": ""})
    assert h100.training.precision.value == "bf16" and "precision: bf16 (megatron-core default)" in h100.assumed
    assert build_run({**ROW, "gpu": "h100-sxm"}).training.recipe == Recipe.TENSORWISE  # Hopper: fp8_cs


@pytest.mark.parametrize("change, reason", [
    (dict(hidden_size="8000"), "hidden_size=8000 in the row, but preset llama3-70b has 8192"),
    (dict(model="Kimi_K3"), "not in the alias table"),
    (dict(framework="jax-something"), "no defaults known for framework"),
])
def test_rows_that_cannot_be_built_say_why(change, reason):
    with pytest.raises(MeshplanError, match=reason.replace("(", r"\(")):
        build_run({**ROW, **change})


def test_missing_preset_is_named():
    with pytest.raises(MeshplanError, match="no preset 'nemotron-3.5-lightning'"):
        build_run({**ROW, "model": "Nemotron_3_5_Lightning"})


def test_unstated_framework_is_the_old_gpt_convention_and_says_so():
    row = {**ROW, "model": "GPT 1.7B", "framework": "", "vocab_size": "51200", "num_kv_heads": "",
           "ffn_hidden_size": "", "gpu": "a100-80gb", "precision": "", "vpp": "1", "pp": "1", "tp": "1",
           "dp": "64", "num_layers": "24", "hidden_size": "2304", "num_heads": "24", "global_batch_size": "512"}
    run = build_run(row)
    assert run.model.ffn_hidden_size == 4 * 2304 and run.model.attn_bias and run.model.tied_embeddings
    assert run.training.precision.value == "fp16" and run.settings == {
        "fused_attention": False, "dropout": True, "tp_overlap": 0.0, "pp_p2p_overlap": 0.5}
    assert run.stack == "megatron"
    assert any("GPT-style" in a and "unstated" in a for a in run.assumed)
    with pytest.raises(MeshplanError, match="vocab_size is blank"):
        build_run({**row, "vocab_size": ""})
    assert set(framework_names()) >= {"megatron-core", "megatron-lm", "megatron-deepspeed", "unstated"}
    assert framework_defaults("").name == "unstated"


def test_row_settings_apply_per_row_and_flags_override():
    run = build_run(ROW)
    base = evaluate([run], [])
    off = evaluate([run], [], settings={"fused_attention": False})
    assert off.rows[0].predicted < base.rows[0].predicted  # materialised scores cost time
    assert base.rows[0].assumed == run.assumed


def test_embedding_and_loss_count_as_layers():
    # Llama 3.1 405B, pp 16 x vpp 8 = 128 chunks for 126 layers + embedding + loss (by hand)
    split = embedding_loss_split(126, 128)
    assert split == (0,) + (1,) * 126 + (0,) and sum(split) == 126
    assert embedding_loss_split(30, 8) == (3, 4, 4, 4, 4, 4, 4, 3)
    with pytest.raises(MeshplanError, match="do not split evenly"):
        embedding_loss_split(30, 7)
    with pytest.raises(MeshplanError, match="at least one layer"):
        Plan(dims=ParallelDims(pp=4), stage_layers=(1, 0, 2, 1))
    plan = Plan(dims=ParallelDims(pp=2), stage_layers=(0, 2))
    assert plan.stage_layers == (0, 2)
    run = build_run({**ROW, "model": "LLAMA3.1_405B", "num_layers": "126", "hidden_size": "16384",
                     "num_heads": "128", "ffn_hidden_size": "53248", "num_gpus": "256", "tp": "2",
                     "pp": "16", "dp": "8", "vpp": "8", "global_batch_size": "256"})
    assert run.plan.stage_layers == split and any("embedding and loss" in a for a in run.assumed)
    est = estimate(run.model, run.cluster, run.training, run.plan)
    assert est.stages[0].layers == 7 and est.stages[-1].layers == 7 and est.stages[1].layers == 8


def test_expert_tensor_parallel_folds_experts_onto_tp_ranks():
    model = model_preset("mixtral-8x7b")  # 8 experts, expert FFN 14336
    training = TrainingSpec(seq_len=4096, global_batch=64)
    cluster = system_preset("dgx-h100", num_nodes=2)
    with pytest.raises(MeshplanError, match="ep=8 must divide dp_shard\\*cp=4"):
        ParallelDims(tp=4, dp_shard=4, ep=8)
    dims = ParallelDims(tp=4, dp_shard=4, ep=8, etp=1)  # 16 ranks: 2 edp x 8 ep x 1 etp
    assert dims.expert_tp == 1 and dims.expert_dp == 2
    with pytest.raises(MeshplanError, match="etp\\*ep=4\\*8 must divide"):
        ParallelDims(tp=4, dp_shard=4, ep=8, etp=4)
    folded = Plan(dims=dims, zero=1, sp=True)
    plain = Plan(dims=ParallelDims(tp=4, dp_shard=4, ep=4), zero=1, sp=True)
    a = estimate(model, cluster, training, folded)
    b = estimate(model, cluster, training, plain)
    # expert weights per GPU: 1/(etp*ep) = 1/8 folded vs 1/(tp*ep) = 1/16 plain; the dense part
    # is the same, so the difference is 1/16 of all expert weights (bf16, 2 bytes each)
    layers, experts_p = model.num_layers, model.moe_num_experts * model.mlp_params(model.moe_ffn_hidden_size)
    diff = a.memory.parameters_bytes - b.memory.parameters_bytes
    assert diff == pytest.approx(layers * experts_p * 2.0 * (1 / 8 - 1 / 16), rel=1e-6)
    assert "etp1" in folded.notation()
    assert Plan.from_dict(folded.to_dict()) == folded
    assert Plan.from_dict({k: v for k, v in plain.to_dict().items()}).dims.etp == 0


def test_runtime_takes_a_first_stage_without_layers():
    """The embedding alone on the first stage (Megatron's account-for-embedding split) runs in
    meshplan's pipeline (tests/runtime/test_pipeline_embedding_chunks.py: loss parity)."""
    from meshplan.plan import Job
    from meshplan.runtime.support import check_runnable

    job = Job(model=model_preset("toy-llama"), training=TrainingSpec(seq_len=64, global_batch=8),
              cluster=system_preset("cpu"), plan=Plan(dims=ParallelDims(pp=2, dp_replicate=2),
                                                     stage_layers=(0, model_preset("toy-llama").num_layers)))
    check_runnable(job)


def test_etp_exports_and_imports():
    from meshplan.export import export_job
    from meshplan.export.import_megatron import import_megatron
    from meshplan.export.torchtitan import torchtitan_sections
    from meshplan.plan import Job

    job = Job(model=model_preset("mixtral-8x7b"), training=TrainingSpec(seq_len=4096, global_batch=64),
              cluster=system_preset("dgx-h100", num_nodes=2),
              plan=Plan(dims=ParallelDims(tp=4, dp_shard=4, ep=8, etp=1), zero=1, sp=True))
    text = export_job(job, "megatron").text
    assert "--expert-tensor-parallel-size 1" in text and "--expert-model-parallel-size 8" in text
    assert import_megatron(text, num_gpus=16).plan.dims == job.plan.dims
    sections, _ = torchtitan_sections(job)
    assert sections["parallelism"]["expert_tensor_parallel_degree"] == 1
    with pytest.raises(MeshplanError, match="no expert tensor parallel"):
        export_job(job, "deepspeed")


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp_shard=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]),
       ep=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([0, 1, 2, 4, 8]))
def test_etp_folding_invariants(tp, dp_shard, cp, ep, etp):
    """The experts' degrees always tile the stage's dp_shard x cp x tp ranks; etp = tp spelled
    out costs exactly what the default (0) costs."""
    try:
        dims = ParallelDims(tp=tp, dp_shard=dp_shard, cp=cp, ep=ep, etp=etp)
    except MeshplanError:
        return
    assert dims.expert_dp * dims.ep * dims.expert_tp == dp_shard * cp * tp
    if etp in (0, tp) and ep <= 8:
        model = model_preset("mixtral-8x7b")
        training = TrainingSpec(seq_len=4096, global_batch=64)
        cluster = system_preset("dgx-h100", num_nodes=max(1, tp * dp_shard * cp // 8)).with_gpus(tp * dp_shard * cp)
        zero = 1 if dp_shard > 1 else 0
        a = estimate(model, cluster, training, Plan(dims=ParallelDims(tp=tp, dp_shard=dp_shard, cp=cp, ep=ep), zero=zero))
        b = estimate(model, cluster, training, Plan(dims=ParallelDims(tp=tp, dp_shard=dp_shard, cp=cp, ep=ep, etp=tp),
                                                    zero=zero))
        assert a.step_time_s == b.step_time_s and a.peak_memory_gib == b.peak_memory_gib


BLOOM_ROW = dict(id="9", source="BLOOM", model="BLOOM-176B", num_layers="70", hidden_size="14336", num_heads="112",
                 vocab_size="250680", seq_len="2048", gpu="a100-80gb", num_gpus="384", gpus_per_node="8",
                 global_batch_size="2048", micro_batch_size="2", tp="4", pp="12", dp="8", recompute="full",
                 measured_tflops_per_gpu="150", flops_basis="hardware", framework="megatron-deepspeed")


def test_a_row_names_its_machine():
    bare = build_run(BLOOM_ROW).cluster
    jean_zay = build_run({**BLOOM_ROW, "system": "jean-zay-a100"}).cluster
    assert (bare.num_nodes, jean_zay.num_nodes) == (48, 48)
    # four 100 Gb/s Omni-Path links for 8 GPUs against a DGX A100's eight 200 Gb/s NICs
    assert jean_zay.inter_node_bandwidth_bytes_per_s == 4 * 12.5e9 / 8
    assert bare.inter_node_bandwidth_bytes_per_s == 4 * jean_zay.inter_node_bandwidth_bytes_per_s


@pytest.mark.parametrize("system,words", [("jean-zay", "unknown cluster"), ("dgx-h100", "holds h100-sxm")])
def test_a_system_that_is_not_the_rows_machine_is_refused(system, words, tmp_path):
    import csv

    from meshplan.calib.validate import REQUIRED_COLUMNS, load_runs
    path = tmp_path / "runs.csv"
    row = {**BLOOM_ROW, "system": system}
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys([*REQUIRED_COLUMNS, *row])), restval="")
        w.writeheader()
        w.writerow(row)
    if system == "jean-zay":  # not a preset: the row is not built, and says why
        assert words in load_runs(path)[1][0].reason
    else:  # a preset of another GPU: the file is wrong
        with pytest.raises(MeshplanError, match=words):
            load_runs(path)
