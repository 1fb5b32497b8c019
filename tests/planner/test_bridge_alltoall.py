"""What each Megatron-Bridge preset sets for its expert all-to-all (issue 14 items 2 and 6):
bridge_recipes.csv's moe_a2a_overlap / moe_token_dispatcher_type / moe_flex_dispatcher_backend,
applied per row as Calibration values (calib/recipe_overlay.py: alltoall_values).

Golden values are read off the preset files named in bridge_recipes.csv's source column
(NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py
@1e7adfa and @07eea52, scripts/performance/configs/qwen/qwen3_workload_base_configs.py@f29a269 and
@01b2977, nemotronh/nemotron_3_workload_base_configs.py@f601ba9,
deepseek/deepseek_workload_base_configs.py@0426418): a preset that
does not set moe_a2a_overlap runs WorkloadBaseConfig's default (False); one that names no flex
backend runs the alltoall dispatcher (scripts/performance/utils/overrides.py)."""

from __future__ import annotations

from math import comb

import pytest

from meshplan.calib.fit import row_calibration
from meshplan.calib.recipe_overlay import alltoall_values, preset_dispatcher
from meshplan.calib.recipes import COMM_COLUMNS, RECIPE_COLUMNS, parse_recipes, shipped_recipes
from meshplan.calib.validate import build_run
from meshplan.cost import estimate
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.errors import MeshplanError
from meshplan.spec.training import MoeDispatcher

# (model, gpu, precision, num_gpus, gbs, mbs, tp, pp, cp, vpp, ep) -> (a2a overlap, dispatcher, backend)
GOLDEN = [
    # GPT-OSS 120B: no preset sets moe_a2a_overlap or a flex backend
    (("gpt-oss-120b", "gb300", "bf16", 64, 1280, 4, 1, 1, 1, 1, 64), (False, "alltoall", "")),
    (("gpt-oss-120b", "b200", "bf16", 64, 1280, 4, 1, 1, 1, 1, 8), (False, "alltoall", "")),
    # GPT-OSS 120B V2 @07eea52: fp8 on HybridEP with moe_a2a_overlap=True on GB200 / GB300 / B300
    (("gpt-oss-120b", "gb200", "fp8", 64, 1280, 4, 1, 1, 1, 1, 64), (True, "flex", "hybridep")),
    (("gpt-oss-120b", "gb300", "fp8", 64, 1280, 4, 1, 1, 1, 1, 16), (True, "flex", "hybridep")),
    (("gpt-oss-120b", "b300", "bf16", 64, 1280, 4, 1, 1, 1, 1, 8), (False, "flex", "hybridep")),
    (("gpt-oss-120b", "b300", "bf16", 64, 512, 4, 1, 1, 1, 1, 64), (False, "alltoall", "")),
    (("gpt-oss-120b", "h100-sxm", "bf16", 64, 1280, 1, 1, 4, 1, 1, 8), (False, "alltoall", "")),
    # Qwen3 235B V2: HybridEP on GB200/GB300, moe_a2a_overlap=True on B300 and H100, False on B200
    (("qwen3-235b-a22b", "gb300", "fp8", 256, 8192, 2, 1, 4, 1, 1, 32), (False, "flex", "hybridep")),
    (("qwen3-235b-a22b", "gb200", "fp8", 256, 8192, 1, 1, 8, 1, 1, 32), (False, "flex", "hybridep")),
    (("qwen3-235b-a22b", "b300", "fp8", 256, 8192, 1, 1, 8, 1, 4, 8), (True, "alltoall", "")),
    (("qwen3-235b-a22b", "b200", "fp8", 256, 8192, 1, 1, 8, 1, 1, 8), (False, "alltoall", "")),
    (("qwen3-235b-a22b", "h100-sxm", "fp8", 256, 8192, 1, 2, 8, 1, 4, 32), (True, "alltoall", "")),
    # Qwen3 235B FP8_MX_V2 @01b2977: the 26.04 tables' vpp 3 (GB200) and vpp 12 (GB300) layouts
    (("qwen3-235b-a22b", "gb200", "fp8", 256, 8192, 1, 1, 8, 1, 3, 32), (False, "flex", "hybridep")),
    (("qwen3-235b-a22b", "gb300", "fp8", 256, 8192, 2, 1, 4, 1, 12, 32), (False, "flex", "hybridep")),
    # Nemotron 3 @f601ba9: BASE_NEMOTRON_3_{SUPER,NANO}_CONFIG name HybridEP for every GPU
    (("nemotron-3-super", "b200", "fp8", 64, 512, 1, 1, 1, 1, 1, 64), (False, "flex", "hybridep")),
    (("nemotron-3-super", "gb200", "fp4", 64, 512, 1, 2, 1, 1, 1, 64), (False, "flex", "hybridep")),
    (("nemotron-3-nano", "b300", "fp8", 8, 512, 4, 1, 1, 1, 1, 8), (False, "flex", "hybridep")),
    # DeepSeek-V3 @0426418: HybridEP with moe_a2a_overlap=False (B200 pp16), =True (GB200 FP8_MX)
    (("deepseek-v3", "b200", "fp8", 256, 4096, 1, 1, 16, 1, 1, 8), (False, "flex", "hybridep")),
    (("deepseek-v3", "gb200", "fp8", 256, 4096, 1, 1, 4, 1, 4, 64), (True, "flex", "hybridep")),
    # Qwen3 30B: HybridEP everywhere but B200; H100 says moe_a2a_overlap=False itself
    (("qwen3-30b-a3b", "gb300", "fp8", 8, 512, 8, 1, 1, 1, 1, 8), (False, "flex", "hybridep")),
    (("qwen3-30b-a3b", "b200", "fp8", 8, 512, 1, 1, 1, 1, 1, 8), (False, "alltoall", "")),
    (("qwen3-30b-a3b", "h100-sxm", "fp8", 16, 1024, 1, 1, 1, 1, 1, 16), (False, "flex", "hybridep")),
]


@pytest.mark.parametrize("key, want", GOLDEN, ids=lambda v: "-".join(map(str, v[:3])) if len(v) > 3 else None)
def test_preset_alltoall_columns_read_off_the_preset_files(key, want):
    r = shipped_recipes()[key]
    assert (r.moe_a2a_overlap, r.moe_token_dispatcher_type, r.moe_flex_dispatcher_backend) == want
    values = dict(alltoall_values(r)[0])
    assert ("ep_overlap" in values) == (not want[0])  # overlap off -> exposed; on -> the stack's
    assert values.get("ep_overlap", 0.0) == 0.0
    # HybridEP: meshplan's flex dispatcher (per-rank sends, no host sync); alltoall: the default
    assert preset_dispatcher(r)[0] == (MoeDispatcher.FLEX if want[2] == "hybridep" else None)


def test_presets_whose_file_was_not_read_for_it_change_nothing():
    llama = next(r for k, r in shipped_recipes().items() if k[0] == "llama3-70b")
    assert llama.moe_a2a_overlap is None and not llama.moe_token_dispatcher_type
    assert alltoall_values(llama) == ((), ()) and preset_dispatcher(llama) == (None, ())


def test_deepep_preset_runs_flex_with_the_host_sync():
    """DeepEP's normal kernels send once per picked rank (flex), but their dispatch waits on the
    host for the received counts (Megatron-Core fused_a2a.py: 'the CPU will wait for GPU's signal
    to arrive'): the flex dispatcher with moe_flex_host_sync, at NCCL's NVLink efficiency (the one
    shipped is DeepSeek-V3's B200 FP8_MX_V2 @0426418, pp8 vpp2 ep32)."""
    (parsed,) = parse_recipes(GOOD.replace(",hybridep", ",deepep"), "r.csv").values()
    shipped = shipped_recipes()[("deepseek-v3", "b200", "fp8", 256, 4096, 1, 1, 8, 1, 2, 32)]
    for r in (parsed, shipped):
        dispatcher, notes = preset_dispatcher(r)
        assert dispatcher == MoeDispatcher.FLEX and "host sync" in notes[0] and "deepep" in notes[0]
        values = dict(alltoall_values(r)[0])
        assert values.get("moe_flex_host_sync") is True and "moe_dispatch_nvlink_efficiency" not in values
    hybrid = dict(alltoall_values(parse_recipes(GOOD, "r.csv")[next(iter(parse_recipes(GOOD, "r.csv")))])[0])
    assert "moe_flex_host_sync" not in hybrid


def test_flex_host_sync_charges_the_sync_the_alltoall_dispatcher_pays():
    run = build_run(ROW_378)  # HybridEP: flex, sync-free
    calib = row_calibration(run, calibration_for(run.cluster.gpu, run.stack).replace_fields(
        moe_alltoall_sync_s=0.1, cuda_graph_full_iteration=False))  # longer than any layer
    free = estimate(run.model, run.cluster, run.training, run.plan, calib)
    synced = estimate(run.model, run.cluster, run.training, run.plan, calib.replace_fields(moe_flex_host_sync=True))
    # Qwen3-235B: every layer MoE; forward 1x and backward 2x the sync per layer and micro-batch,
    # which the layer waits for (host-bound: max(device, host)), on the slowest rank's 12 layers
    layers = max(s.layers for s in synced.stages)
    bound = synced.time.num_microbatches * layers * 3 * 0.1
    assert synced.time.compute_s == pytest.approx(bound, rel=0.01)
    assert free.time.compute_s < 0.05 * bound


GOOD = (",".join(RECIPE_COLUMNS + COMM_COLUMNS)
        + "\nqwen3-30b-a3b,gb300,fp8,8,512,8,1,1,1,1,8,,,,,CFG,path.py@abc,0,flex,hybridep\n")


@pytest.mark.parametrize("text, message", [
    (GOOD.replace(",0,flex,", ",no,flex,"), "line 2: column moe_a2a_overlap: 'no' is not 0, 1 or blank"),
    (GOOD.replace(",flex,", ",allgather,"), "line 2: column moe_token_dispatcher_type: 'allgather' is not one of"),
    (GOOD.replace(",hybridep", ",nccl"), "line 2: column moe_flex_dispatcher_backend: 'nccl' is not one of"),
    (GOOD.replace(",flex,", ",alltoall,"), "is not one of deepep, hybridep under moe_token_dispatcher_type flex"),
])
def test_malformed_alltoall_cell_is_one_clear_line(text, message):
    with pytest.raises(MeshplanError) as exc:
        parse_recipes(text, "r.csv")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_file_without_the_alltoall_columns_reads_them_blank():
    old = ",".join(RECIPE_COLUMNS) + "\nllama3-70b,gb300,fp8,64,256,2,1,1,1,1,1,1,,,20,CFG,path.py@abc\n"
    (r,) = parse_recipes(old, "r.csv").values()
    assert r.moe_a2a_overlap is None and alltoall_values(r) == ((), ())


# runs_megatron_bridge.csv row 367 (container 26.04.01): GPT-OSS 120B bf16 on 64 GB300, GBS 1280,
# MBS 4, ep64 (preset GPT_OSS_120B_PRETRAIN_CONFIG_GB300_BF16_V2: no recompute, no a2a overlap).
ROW_367 = dict(id="367", source="Megatron-Bridge 26.04.01", model="GPT OSS 120B", seq_len="4096", gpu="gb300",
               num_gpus="64", gpus_per_node="4", global_batch_size="1280", micro_batch_size="4", tp="1",
               pp="1", cp="1", ep="64", vpp="1", precision="bf16", measured_tokens_per_s_per_gpu="10000",
               framework="megatron-core")


def test_gpt_oss_row_runs_its_alltoall_exposed_by_hand():
    run = build_run(ROW_367)
    assert dict(run.release_values).get("ep_overlap") == 0.0
    assert any("moe_a2a_overlap off" in a for a in run.assumed)
    overlap = 0.5  # what a stack that overlaps the all-to-all would hide
    stack = calibration_for(run.cluster.gpu, run.stack).replace_fields(ep_overlap=overlap)
    preset = row_calibration(run, stack)  # the fit's per-row helper applies the preset's value
    assert preset.ep_overlap == 0.0
    hidden = estimate(run.model, run.cluster, run.training, run.plan, stack).time
    exposed = estimate(run.model, run.cluster, run.training, run.plan, preset).time

    # By hand (cost/moe.py dispatch_time, comms.all_to_all_time): every rank routes T = mb*S tokens,
    # each of the k=4 copies D=2880 wide in bf16 to its expert's rank; ep64 lies inside one NVL72
    # domain: 63 peers at NVLink bandwidth, 63 latencies; dispatch + combine, x the routing load.
    m = run.model
    T = 4 * 4096
    nbytes = T * m.hidden_size * 2 * m.moe_top_k
    nvlink = run.cluster.intra_node_bandwidth_bytes_per_s * preset.intra_node_comm_efficiency
    lat_f, bw_f = preset.collective_factors("all_to_all")
    a2a = 63 / (nvlink * bw_f) * nbytes / 64 + 63 * run.cluster.intra_node_latency_s * lat_f
    dispatch = preset.moe_routing_imbalance * 2 * a2a
    micro = 1280 // (64 * 4)
    # all of it exposed: forward and backward (the backward repeats dispatch and combine), per layer
    assert exposed.exposed_ep_s == pytest.approx(micro * m.num_layers * 2 * dispatch, rel=1e-6)
    # the stack's overlap hides half of each (compute is longer than the all-to-all here)
    assert hidden.exposed_ep_s == pytest.approx((1 - overlap) * exposed.exposed_ep_s, rel=1e-6)
    assert exposed.step_s - hidden.step_s == pytest.approx(overlap * exposed.exposed_ep_s, rel=1e-6)


# runs_megatron_bridge.csv row 292 (container 26.08): Qwen3 30B-A3B fp8 on 8 GB300, GBS 512, MBS 8,
# ep8 in one NVL72 domain; its preset runs HybridEP (flex, backend hybridep), no a2a overlap.
ROW_292 = dict(id="292", source="Megatron-Bridge 26.08", model="Qwen3_30B_a3B", seq_len="4096", gpu="gb300",
               num_gpus="8", gpus_per_node="8", global_batch_size="512", micro_batch_size="8", tp="1",
               pp="1", cp="1", ep="8", vpp="1", precision="fp8", measured_tokens_per_s_per_gpu="44544",
               framework="megatron-core")


def test_hybridep_row_moves_its_tokens_at_nvlink_bandwidth_by_hand():
    run = build_run(ROW_292)
    values = dict(run.release_values)
    assert values.get("moe_dispatch_nvlink_efficiency") == 1.0
    assert any("moe_dispatch_nvlink_efficiency" in a for a in run.assumed)
    assert run.training.moe_dispatcher == MoeDispatcher.FLEX
    assert any("moe dispatcher: flex" in a for a in run.assumed)
    stack = calibration_for(run.cluster.gpu, run.stack).replace_fields(intra_node_comm_efficiency=0.4)
    preset = row_calibration(run, stack)
    assert preset.intra_node_comm_efficiency == 0.4  # NCCL's stays for every other collective
    got = estimate(run.model, run.cluster, run.training, run.plan, preset)

    # By hand: T = 8*4096 tokens per rank, D=2048 in bf16 (HybridEP dispatches bf16 under fp8
    # too); ep8 inside one domain, 16 of the E=128 experts per rank, top-8: a token goes once to
    # each peer holding one of its experts, 1 - C(112,8)/C(128,8) = 0.6672 of the 7 peers (4.67
    # sends, not alltoall's 7/8 of 8 copies = 7), at the full NVLink bandwidth (HybridEP, not 0.4
    # of it), 7 latencies; dispatch + combine, x the routing load; forward + backward, exposed.
    m = run.model
    assert (m.moe_num_experts, m.moe_top_k, m.hidden_size) == (128, 8, 2048)
    token_bytes = 8 * 4096 * 2048 * 2  # 134.2 MB: one copy of the rank's tokens
    sends = 7 * (1 - comb(112, 8) / comb(128, 8))  # 4.670
    lat_f, bw_f = preset.collective_factors("all_to_all")
    nvlink = run.cluster.intra_node_bandwidth_bytes_per_s * 1.0
    a2a = sends * token_bytes / (nvlink * bw_f) + 7 * run.cluster.intra_node_latency_s * lat_f
    dispatch = preset.moe_routing_imbalance * 2 * a2a
    micro = 512 // (8 * 8)
    assert got.time.exposed_ep_s == pytest.approx(micro * m.num_layers * 2 * dispatch, rel=1e-6)
    nccl = estimate(run.model, run.cluster, run.training, run.plan,
                    preset.replace_fields(moe_dispatch_nvlink_efficiency=0.0))
    assert nccl.time.exposed_ep_s > 2 * got.time.exposed_ep_s  # 0.4 of NVLink: 2.5x the bandwidth term


def test_dispatch_efficiency_out_of_range_is_one_clear_line():
    with pytest.raises(MeshplanError, match="moe_dispatch_nvlink_efficiency must be in"):
        Calibration(moe_dispatch_nvlink_efficiency=1.5)


# runs_megatron_bridge.csv rows 378 / 380 (container 26.04.01): Qwen3 235B-A22B fp8 on 256 GB200
# (pp8 vpp3 ep32, preset QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 @01b2977: HybridEP, router
# and preprocess CUDA-graphed) and on 256 B200 (pp8 ep8, FP8_CS_V2/FP8_MX_V2: the alltoall dispatcher).
ROW_378 = dict(id="378", source="Megatron-Bridge 26.04.01", model="Qwen3_235B_a22B", seq_len="4096", gpu="gb200",
               num_gpus="256", gpus_per_node="8", global_batch_size="8192", micro_batch_size="1", tp="1",
               pp="8", cp="1", ep="32", vpp="3", precision="fp8", measured_tokens_per_s_per_gpu="7000",
               framework="megatron-core")
ROW_380 = {**ROW_378, "id": "380", "gpu": "b200", "ep": "8", "vpp": "1"}


def test_gb200_preset_is_sync_free_where_the_b200_preset_syncs():
    """Why GB200 rows show none of the MoE host sync B200 rows show: their presets differ. The
    GB200 preset runs HybridEP (buffers sized on the device, no per-layer sync of the token
    counts); the B200 one the dropless alltoall dispatcher, which syncs once per MoE layer."""
    gb200, b200 = build_run(ROW_378), build_run(ROW_380)
    assert gb200.training.moe_dispatcher == MoeDispatcher.FLEX
    assert any("GB200_FP8_MX_V2" in a and "hybridep" in a for a in gb200.assumed)
    assert b200.training.moe_dispatcher == MoeDispatcher.ALLTOALL
    for run, synced in ((gb200, False), (b200, True)):
        calib = row_calibration(run, calibration_for(run.cluster.gpu, run.stack).replace_fields(
            moe_alltoall_sync_s=0.1, cuda_graph_full_iteration=False))  # longer than any layer
        base = estimate(run.model, run.cluster, run.training, run.plan, calib).step_time_s
        free = estimate(run.model, run.cluster, run.training, run.plan,
                        calib.replace_fields(moe_alltoall_sync_s=0.0)).step_time_s
        assert (base > free) == synced
