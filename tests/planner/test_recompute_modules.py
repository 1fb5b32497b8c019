"""Megatron-Core's selective recompute by module (Plan.recompute_modules, cost/recompute_modules.py).

Golden values by hand from the layer's tensors (the module docstring's formulas), one micro-batch
of b*S = 4096 tokens on one GPU, bf16 (a = a_l = 2 bytes), tp 1, fused attention (no s^2 scores):

* Llama-3-8B (D 4096, SwiGLU F 14336): mlp drops T*F*(2a + a_l) = 4096*14336*6 B = 336 MiB;
  layernorm both norms' outputs, 2*T*D*a_l = 4096*4096*4 B = 64 MiB.
* Qwen3-30B-A3B (D 2048, 128 experts of F 768, top-8, every layer MoE): moe_act drops the experts'
  fc2 inputs, T*k*F*a_l = 4096*8*768*2 B = 48 MiB; moe their inner tensors T*k*F*6 = 144 MiB
  plus the routed copies T*k*D*a*c (c = Calibration.moe_routed_copies_kept).
* DeepSeek-V3 (128 heads, d_qk 192, d_v 128): mla_up_proj drops q, k and v, T*N*(2*192 + 128)*a
  = 4096*128*512*2 B = 512 MiB in every layer.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.calibration import calibration_for
from meshplan.cost.layer import layer_cost
from meshplan.errors import MeshplanError
from meshplan.export.common import export_job, search_options_for
from meshplan.plan import Job, Offload, ParallelDims, Plan, Recompute, missing_module, recompute_module_code
from meshplan.plan import RecomputeModule as M
from meshplan.search.space import enumerate_space
from meshplan.search.space_membership import in_space, why_outside
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec
from meshplan.targets import runnable_mask, why_not

H100 = system_preset("dgx-h100")
CALIB = calibration_for(H100.gpu, "megatron")
TRAIN = TrainingSpec(seq_len=4096, global_batch=64)
T = 4096
MIB = 2.0 ** 20
SEL = Recompute.SELECTIVE


def _layers(model_name: str, *module_sets, **plan):
    """layer_cost for one plan per module set (selective recompute), as a list of per-plan values."""
    model = model_preset(model_name)
    plans = [Plan(recompute=SEL, recompute_modules=s, **plan) for s in module_sets]
    return layer_cost(model, H100, TRAIN, PlanArrays.from_plans(plans), CALIB)


def test_default_and_core_attn_alone_are_one_plan():
    assert Plan(recompute=SEL, recompute_modules=(M.CORE_ATTN,)) == Plan(recompute=SEL)
    assert Plan(recompute=SEL, recompute_modules=("layernorm", "moe_act")).recompute_modules == (M.MOE_ACT, M.LAYERNORM)
    assert recompute_module_code(()) == recompute_module_code((M.CORE_ATTN,)) == 0
    assert recompute_module_code((M.MOE_ACT,)) == M.MOE_ACT.bit


def test_llama_mlp_and_layernorm_golden():
    lc = _layers("llama3-8b", (), (M.CORE_ATTN, M.MLP), (M.CORE_ATTN, M.LAYERNORM), (M.MLP,))
    kept = lc.act_selective_bytes
    assert kept[0] - kept[1] == pytest.approx(336 * MIB, rel=1e-12)
    assert kept[0] - kept[2] == pytest.approx(64 * MIB, rel=1e-12)
    assert kept[3] == pytest.approx(kept[1], rel=1e-12)  # fused attention: core_attn drops nothing
    assert kept[0] == pytest.approx(lc.act_none_bytes[0], rel=1e-12)
    rerun = lc.recompute_selective_s
    assert rerun[1] > rerun[0] and rerun[2] > rerun[0]
    # the MLP's forward (two GEMMs of 2*T*D*2F and 2*T*F*D FLOPs) takes longer than the attention core
    assert rerun[3] > rerun[0]


def test_qwen3_moe_act_and_moe_golden():
    lc = _layers("qwen3-30b-a3b", (), (M.CORE_ATTN, M.MOE_ACT), (M.CORE_ATTN, M.MOE), (M.CORE_ATTN, M.MOE, M.MOE_ACT))
    kept = lc.act_selective_bytes
    assert kept[0] - kept[1] == pytest.approx(48 * MIB, rel=1e-12)
    routed = T * 8 * 2048 * 2 * CALIB.moe_routed_copies_kept
    assert kept[0] - kept[2] == pytest.approx(144 * MIB + routed, rel=1e-12)
    assert kept[3] == pytest.approx(kept[2], rel=1e-12)  # moe_act lies inside moe: dropped once
    assert lc.recompute_selective_s[3] == pytest.approx(lc.recompute_selective_s[2], rel=1e-12)
    assert lc.recompute_selective_s[2] > lc.recompute_selective_s[1] > lc.recompute_selective_s[0]


def test_deepseek_mla_up_proj_golden_and_moe_act_weighted_by_moe_layers():
    lc = _layers("deepseek-v3", (), (M.CORE_ATTN, M.MLA_UP_PROJ), (M.CORE_ATTN, M.MOE_ACT))
    kept = lc.act_selective_bytes
    assert kept[0] - kept[1] == pytest.approx(512 * MIB, rel=1e-12)
    # 58 of 61 layers hold experts: 2048*8 per token, fc2's input
    assert kept[0] - kept[2] == pytest.approx(58 / 61 * T * 8 * 2048 * 2, rel=1e-12)


def test_full_and_none_do_not_read_the_modules():
    model = model_preset("qwen3-30b-a3b")
    plans = [Plan(recompute=SEL, recompute_modules=(M.MOE,)), Plan(recompute=Recompute.FULL), Plan()]
    lc = layer_cost(model, H100, TRAIN, PlanArrays.from_plans(plans), CALIB)
    base = layer_cost(model, H100, TRAIN, PlanArrays.from_plans(plans[1:]), CALIB)
    assert lc.act_full_bytes[1] == base.act_full_bytes[0] and lc.act_none_bytes[2] == base.act_none_bytes[1]


# ---- the plan -------------------------------------------------------------------------------
def test_notation_json_and_old_plan_files():
    plan = Plan(recompute=SEL, recompute_modules=(M.LAYERNORM, M.MOE_ACT))
    assert "ckpt=sel(moe_act+layernorm):all" in plan.with_defaults(model_preset("qwen3-30b-a3b")).notation()
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    old = plan.to_dict()
    del old["recompute_modules"]  # a version-1 plan: the default modules
    assert Plan.from_dict(old) == Plan(recompute=SEL)
    job = Job(model=model_preset("qwen3-30b-a3b"), training=TRAIN, cluster=H100,
              plan=Plan(dims=ParallelDims(dp_replicate=8), recompute=SEL))
    data = job.to_dict()
    data["meshplan_plan_version"] = 1
    del data["plan"]["recompute_modules"]
    assert Job.from_dict(data).plan == job.plan


@pytest.mark.parametrize("fields, message", [
    (dict(recompute_modules=("moe_act",)), "need recompute 'selective'"),
    (dict(recompute=Recompute.FULL, recompute_modules=("moe_act",)), "need recompute 'selective'"),
    (dict(recompute=SEL, recompute_modules=("attn",)), "each must be one of core_attn"),
])
def test_bad_plans(fields, message):
    with pytest.raises(MeshplanError, match=message):
        Plan(**fields)


@pytest.mark.parametrize("model, module, what", [("llama3-8b", M.MOE_ACT, "experts"),
                                                 ("qwen3-30b-a3b", M.MLA_UP_PROJ, "multi-head latent attention"),
                                                 ("qwen3-30b-a3b", M.SHARED_EXPERTS, "shared experts")])
def test_modules_the_model_lacks(model, module, what):
    with pytest.raises(MeshplanError, match=f"recompute module {module.value}: .* has no {what}"):
        Plan(recompute=SEL, recompute_modules=(module,)).validate_for(model_preset(model), TRAIN, 1)


# ---- exporters and targets --------------------------------------------------------------------
def _job(model="qwen3-30b-a3b", **plan) -> Job:
    p = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, **plan)
    return Job(model=model_preset(model), training=TRAIN, cluster=H100, plan=p)


def test_megatron_writes_the_modules_and_bridge_its_list():
    job = _job(recompute=SEL, recompute_modules=(M.CORE_ATTN, M.MOE_ACT, M.LAYERNORM))
    text = export_job(job, "megatron").text
    assert "--recompute-granularity selective \\\n--recompute-modules core_attn moe_act layernorm" in text
    assert "--moe-grouped-gemm" in text  # Megatron-Core takes moe_act with grouped GEMMs only
    bridge = export_job(job, "megatron-bridge").text
    assert "model.recompute_modules=[core_attn,moe_act,layernorm]" in bridge
    assert "model.recompute_modules=[core_attn]" in export_job(_job(recompute=SEL), "megatron-bridge").text
    assert "--recompute-modules" not in export_job(_job(recompute=SEL), "megatron").text


def test_megatron_writes_activation_offload_and_refuses_what_megatron_core_refuses():
    text = export_job(_job(offload=(Offload.ACTIVATIONS,), offload_layers=20), "megatron").text
    assert "--cpu-offloading \\\n--cpu-offloading-num-layers 20" in text
    every = export_job(_job(offload=(Offload.ACTIVATIONS,)), "megatron").text
    assert "--cpu-offloading-num-layers 47" in every  # all but one of the 48 layers: Megatron's most
    bridge = export_job(_job(offload=(Offload.ACTIVATIONS,), offload_layers=20), "megatron-bridge").text
    assert "model.cpu_offloading=true" in bridge and "model.cpu_offloading_num_layers=20" in bridge
    with pytest.raises(MeshplanError, match="does not work with activation recompute"):
        export_job(_job(offload=(Offload.ACTIVATIONS,), recompute=SEL), "megatron")
    pp = Job(model=model_preset("qwen3-30b-a3b"), training=TRAIN, cluster=H100,
             plan=Plan(dims=ParallelDims(pp=2, dp_shard=4, ep=4), zero=1, offload=(Offload.ACTIVATIONS,)))
    with pytest.raises(MeshplanError, match="without pipeline parallel; the plan has pp=2"):
        export_job(pp, "megatron")


@pytest.mark.parametrize("target, stack", [("torchtitan", "torchtitan"), ("deepspeed", "DeepSpeed")])
def test_other_stacks_refuse_naming_the_module(target, stack):
    job = _job(recompute=SEL, recompute_modules=(M.MOE_ACT,))
    with pytest.raises(MeshplanError, match=f"{stack} cannot recompute module 'moe_act'"):
        export_job(job, target)


def test_meshplan_runtime_refuses_output_discarding_modules_and_the_mask_agrees():
    model = model_preset("toy-moe")
    tr = TrainingSpec(seq_len=16, global_batch=8)
    ok = Plan(recompute=SEL, recompute_modules=(M.CORE_ATTN, M.MOE))
    bad = Plan(recompute=SEL, recompute_modules=(M.MOE_ACT,))
    assert why_not("meshplan", model, tr, ok) is None
    assert "recompute module 'moe_act' is not supported by this runtime" in why_not("meshplan", model, tr, bad)
    assert list(runnable_mask("meshplan", PlanArrays.from_plans([ok, bad]), model, tr)) == [True, False]


def test_megatron_search_tries_the_module_sets_on_moe_models_only():
    opts = search_options_for("megatron")
    tr = TrainingSpec(seq_len=4096, global_batch=256)
    moe = enumerate_space(model_preset("qwen3-30b-a3b"), tr, 8, opts)
    codes = set(np.unique(moe.recompute_modules).tolist())
    # no MLA: no mla_up_proj set; core_attn+moe+moe_act+layernorm costs as core_attn+moe+layernorm
    assert codes == {0, recompute_module_code((M.MOE_ACT, M.LAYERNORM)),
                     recompute_module_code((M.CORE_ATTN, M.MOE_ACT, M.LAYERNORM)),
                     recompute_module_code((M.MOE_ACT,)), recompute_module_code((M.MOE, M.LAYERNORM)),
                     recompute_module_code((M.CORE_ATTN, M.MOE, M.LAYERNORM))}
    assert set(moe.recompute[moe.recompute_modules > 0].tolist()) == {1}  # selective rows only
    assert set(np.unique(enumerate_space(model_preset("llama3-8b"), tr, 8, opts).recompute_modules)) == {0}
    plan = Plan(dims=ParallelDims(dp_shard=8, ep=8), zero=1, recompute=SEL, recompute_modules=(M.MOE_ACT, M.LAYERNORM))
    assert in_space(model_preset("qwen3-30b-a3b"), tr, 8, plan, opts)
    assert not in_space(model_preset("qwen3-30b-a3b"), tr, 8, plan)
    assert "not searched" in why_outside(model_preset("qwen3-30b-a3b"), tr, 8, plan)


# ---- the command line -----------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True)


BASE = ("estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64", "--ep", "8", "--zero", "1", "--recompute", "selective", "--target", "megatron")


def test_cli_estimate_takes_the_modules():
    default = _cli(*BASE, "--json")
    modules = _cli(*BASE, "--recompute-modules", "moe_act+layernorm", "--json")
    assert default.returncode == 0 and modules.returncode == 0, modules.stderr
    a, b = json.loads(default.stdout), json.loads(modules.stdout)
    assert b["memory_gib"]["activations"] < a["memory_gib"]["activations"]
    assert "ckpt=sel(moe_act+layernorm):all" in b["plan"]


@pytest.mark.parametrize("extra, message", [
    (("--recompute-modules", "moe_act+attn"), "--recompute-modules 'moe_act+attn': 'attn' is not one of"),
    (("--recompute-modules", "mla_up_proj"), "recompute module mla_up_proj: qwen3-30b-a3b has no multi-head"),
])
def test_cli_bad_modules_one_line(extra, message):
    out = _cli(*BASE, *extra)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_estimate_target_megatron_overlaps_activation_offload_as_megatron_core_does():
    """frameworks.json megatron-core: activation_offload_overlap 1 (Megatron-Core's offload runs
    Transformer Engine's schedule: copies on a stream of their own); ``--target megatron`` exports for
    Megatron-Core, so its estimate takes it. The stall follows that schedule (cost.offload
    offload_schedule_exposed_s): none for 40 of 80 layers here, every copy for all 80 (N = L leaves no
    layer to hide behind; Megatron runs at most L - 1); meshplan's runtime (save_on_cpu) hides none."""
    args = ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--zero", "1", "--tp", "8", "--offload", "activations", "--json", "--target")
    mine, meg = (json.loads(_cli(*args, t, "--offload-layers", "40").stdout) for t in ("meshplan", "megatron"))
    assert meg["time_s"]["offload_total"] > 0.0
    assert meg["time_s"]["offload"] == 0.0  # 40 copies of c over 78 layers' passes: hidden
    assert mine["time_s"]["offload"] == pytest.approx(mine["time_s"]["offload_total"])
    every = json.loads(_cli(*args, "megatron").stdout)["time_s"]
    assert every["offload"] == pytest.approx(every["offload_total"])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"]),
       st.sets(st.sampled_from(list(M))), st.sampled_from(list(M)), st.sampled_from([1, 2]), st.booleans())
def test_one_more_module_keeps_no_more_and_reruns_no_less(model_name, modules, extra, tp, sp):
    """Monotone in the set: recomputing one more module never keeps more activations nor reruns less."""
    model = model_preset(model_name)
    chosen = tuple(m for m in modules if missing_module(model, (m,)) is None) or (M.CORE_ATTN,)  # () means it
    if missing_module(model, (extra,)) is not None:
        extra = M.CORE_ATTN
    plans = [Plan(dims=ParallelDims(tp=tp), sp=sp and tp > 1, recompute=SEL, recompute_modules=s)
             for s in (chosen, chosen + (extra,))]
    lc = layer_cost(model, H100, TRAIN, PlanArrays.from_plans(plans), CALIB)
    assert lc.act_selective_bytes[1] <= lc.act_selective_bytes[0] * (1 + 1e-12)
    assert lc.recompute_selective_s[1] >= lc.recompute_selective_s[0] * (1 - 1e-12)
    assert 0 < lc.act_selective_bytes[1] <= lc.act_none_bytes[1] * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"]),
       st.lists(st.sets(st.sampled_from(list(M))), min_size=1, max_size=4), st.sampled_from([1, 2, 4]),
       st.booleans(), st.sampled_from(["megatron", "meshplan"]), st.sampled_from(["bf16", "fp8"]))
def test_module_columns_equal_one_call_per_code(model_name, sets, tp, sp, stack, precision):
    """layer_cost(module_codes=...) (the group bounds' table): each column is, bit for bit, the
    selective fields of the same plans with that code among codes also > 0 (layer_cost's path for a
    mixed batch), and every other field the plans' own."""
    model = model_preset(model_name)
    sets = [tuple(m for m in s if missing_module(model, (m,)) is None) for s in sets]
    codes = np.unique([0, 1 << 20] + [recompute_module_code(s) for s in sets])  # 1 << 20: no module's bit
    calib = calibration_for(H100.gpu, stack)
    training = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision(precision))
    plans = PlanArrays.from_plans([Plan(dims=ParallelDims(tp=tp), sp=sp and tp > 1, micro_batch=b) for b in (1, 2)])
    cols = layer_cost(model, H100, training, plans, calib, module_codes=codes)
    for j, code in enumerate(codes):
        one = PlanArrays(**{**{f: getattr(plans, f) for f in plans.__dataclass_fields__},
                            "recompute_modules": np.full(len(plans), code)})
        # (a batch holding a nonzero code: the module path, as every row of the bounds' table)
        both = PlanArrays(**{f: np.concatenate([getattr(one, f), getattr(one, f)[:1]])
                             for f in one.__dataclass_fields__}
                          | {"recompute_modules": np.append(np.full(len(plans), code), 1 << 20)})
        ref = layer_cost(model, H100, training, both, calib)
        for f in ("act_selective_bytes", "recompute_selective_s"):
            assert np.array_equal(np.broadcast_to(getattr(cols, f), (len(plans), codes.size))[:, j],
                                  np.broadcast_to(getattr(ref, f), (len(plans) + 1,))[:2]), f
    for f in ("fwd_compute_s", "act_none_bytes", "state_bytes"):
        assert np.array_equal(np.broadcast_to(getattr(cols, f), (2,)),
                              np.broadcast_to(getattr(layer_cost(model, H100, training, plans, calib), f), (2,)))


@pytest.mark.parametrize("fields", [dict(recompute=SEL, recompute_modules=(M.MOE_ACT, M.LAYERNORM)),
                                    dict(offload=(Offload.ACTIVATIONS,), offload_layers=20),
                                    dict(offload=(Offload.ACTIVATIONS,))])
def test_megatron_import_reads_the_modules_and_activation_offload_back(fields):
    from meshplan.export.import_megatron import import_megatron

    job = _job(**fields)
    back = import_megatron(export_job(job, "megatron").text, num_gpus=8).plan
    assert back.recompute_modules == job.plan.recompute_modules
    assert (back.offload, back.offload_layers) == (job.plan.offload, job.plan.offload_layers)


@pytest.mark.parametrize("args, message", [
    ("--recompute-granularity selective --recompute-modules moe_act attn", "--recompute-modules 'attn' is not one of"),
    ("--cpu-offloading", "--cpu-offloading with --cpu-offloading-num-layers None"),
])
def test_megatron_import_bad_modules_and_offload(args, message):
    from meshplan.export.import_megatron import import_megatron

    with pytest.raises(MeshplanError, match=message):
        import_megatron(f"--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 --seq-length 128 "
                        f"--global-batch-size 8 --micro-batch-size 1 {args}", num_gpus=1)
