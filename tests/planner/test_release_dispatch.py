"""The expert all-to-all a Megatron-Bridge release's presets ran, where it is not the one
bridge_recipes.csv reads at a later commit (spec/stack_version.py ``release_dispatch``,
calib/release_comm.py; issue 14, the DeepSeek-V3 25.09 / 25.11 rows).

Golden values are read off the sources stack_releases.json cites: HybridEP reached Megatron-Core
(PR #2176) and Megatron-Bridge (PR #1367, r0.2.0 by PR #1425) in November 2025, after 25.09; the
25.11 DeepSeek-V3 base configs give GB200 / GB300 'hybridep' and B200 no backend, all with
moe_a2a_overlap False; Bridge issue #1731 measures HybridEP on B200 pp16 ep8 in January 2026 (the
26.02 V1/V2 presets name it); GB200 FP8_MX aliases the overlap-free GB200 V1 preset until PR
#4226 (26.06)."""

from __future__ import annotations

import pytest

from meshplan.calib.recipes import CommSettings, shipped_recipes
from meshplan.calib.release_comm import release_comm
from meshplan.calib.validate import build_run
from meshplan.errors import MeshplanError
from meshplan.spec.stack_version import release_dispatch, release_values
from meshplan.spec.training import MoeDispatcher

ALLTOALL = {"moe_token_dispatcher_type": "alltoall", "moe_a2a_overlap": False}
HYBRIDEP = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep", "moe_a2a_overlap": False}


@pytest.mark.parametrize("release, gpu, model, want", [
    ("25.09", "b200", "deepseek-v3", ALLTOALL),        # no HybridEP yet; token drop turns DeepEP off
    ("25.11", "b200", "deepseek-v3", ALLTOALL),        # the 25.11 B200 base config names no backend
    ("26.02", "b200", "deepseek-v3", {}),              # 'before' excludes 26.02: the file's hybridep
    ("25.09", "gb200", "deepseek-v3", ALLTOALL),
    ("25.11", "gb200", "deepseek-v3", HYBRIDEP),       # PR #1367 in r0.2.0
    ("26.04", "gb200", "deepseek-v3", HYBRIDEP),       # FP8_MX aliases GB200 V1 until PR #4226
    ("26.06", "gb200", "deepseek-v3", {}),             # PR #4226: the file's overlap holds
    ("25.11", "gb300", "deepseek-v3-nomtp", HYBRIDEP),  # 'w/o MTP' ran the DeepSeek-V3 preset
    ("25.09", "h100-sxm", "deepseek-v3", {}),          # H100 presets: not dated here
    ("25.11", "b200", None, {}),                       # the entries name their models
    ("25.11", "b200", "kimi-k2", {}),
])
def test_release_dispatch_by_release_gpu_and_model(release, gpu, model, want):
    got = release_dispatch("megatron", release, family="deepseek" if model != "kimi-k2" else "kimi", gpu=gpu,
                           precision="fp8", moe=True, model=model)
    assert got == want


def test_a_dispatch_entry_sets_no_calibration_value_and_a_values_entry_no_dispatch():
    # the two keys of an entry are read apart: the 25.11 B200 release values stay the recipe's
    # optimizer and TE's loss, and a release without a dispatch entry gives none
    values = release_values("megatron", "25.11", family="deepseek", gpu="b200", precision="fp8", moe=True,
                            model="deepseek-v3")
    assert set(values) == {"adam_bytes_per_param", "logits_bytes_per_element"}
    assert release_dispatch("megatron", "26.08", family="qwen", gpu="gb200", precision="fp8", moe=True,
                            model="qwen3-30b-a3b") == {}


BASE = CommSettings(moe_a2a_overlap=True, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                    label="file")


def test_release_comm_replaces_what_the_release_names_and_keeps_the_rest():
    alltoall = release_comm({"moe_token_dispatcher_type": "alltoall"}, BASE, "25.11")
    # a dispatcher named without a backend runs none; the overlap not named stays the file's
    assert (alltoall.moe_token_dispatcher_type, alltoall.moe_flex_dispatcher_backend, alltoall.moe_a2a_overlap) == (
        "alltoall", "", True)
    assert not alltoall.sync_free_dispatch and alltoall.label == "25.11"
    off = release_comm({"moe_a2a_overlap": False}, BASE, "26.04")
    assert (off.moe_token_dispatcher_type, off.moe_flex_dispatcher_backend, off.moe_a2a_overlap) == (
        "flex", "hybridep", False) and off.sync_free_dispatch
    none = release_comm({"moe_a2a_overlap": False}, None, "x")  # a row with no preset of its layout
    assert (none.moe_token_dispatcher_type, none.moe_a2a_overlap) == ("", False)


@pytest.mark.parametrize("dispatch, says", [
    ({"moe_dispatcher": "flex"}, "'moe_dispatcher' is not one of"),
    ({"moe_token_dispatcher_type": "flex"}, "is not alltoall, or flex with one of"),  # flex needs a backend
    ({"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": "hybridep"}, "is not alltoall"),
    ({"moe_token_dispatcher_type": "allgather"}, "is not alltoall"),
    ({"moe_a2a_overlap": "no"}, "is not true or false"),
])
def test_a_bad_dispatch_entry_is_one_clear_error(dispatch, says):
    with pytest.raises(MeshplanError, match=says):
        release_comm(dispatch, BASE, "x")


# The DeepSeek-V3 B200 layout of the 25.09-26.04 tables (pp 16, ep 8, mb 1; GBS 2048 in 25.x)
ROW_531 = dict(id="531", source="Megatron-Bridge 25.11", model="DeepSeekV3 (w/ MTP)", seq_len="4096", gpu="b200",
               num_gpus="256", gpus_per_node="8", global_batch_size="2048", micro_batch_size="1", tp="1", pp="16",
               cp="1", ep="8", vpp="1", precision="fp8", measured_tokens_per_s_per_gpu="2139",
               framework="megatron-core")
ROW_546 = {**ROW_531, "id": "546", "source": "Megatron-Bridge 25.09", "model": "DeepSeekV3 (tokendrop)",
           "gpu": "gb200", "pp": "4", "vpp": "4", "ep": "64", "measured_tokens_per_s_per_gpu": "3454"}


def test_the_25x_deepseek_b200_row_runs_alltoall_over_its_preset_files_hybridep():
    """Row 531 matches the V1 preset read at 0426418, which names HybridEP; its 25.11 release ran
    the alltoall dispatcher: the dropless dispatcher (one send per routed copy, a host sync of the
    token counts per MoE layer) at NCCL's fitted NVLink rate, exposed (pp 16 without virtual stages)."""
    preset = shipped_recipes()[("deepseek-v3", "b200", "fp8", 256, 2048, 1, 1, 16, 1, 1, 8)]
    assert preset.moe_flex_dispatcher_backend == "hybridep"
    run = build_run(ROW_531)
    assert run.training.moe_dispatcher == MoeDispatcher.ALLTOALL
    assert run.release_values["ep_overlap"] == 0.0 and "moe_dispatch_nvlink_efficiency" not in run.release_values
    assert any("moe all-to-all: alltoall" in a and "25.11" in a for a in run.assumed)
    later = build_run({**ROW_531, "source": "Megatron-Bridge 26.02", "global_batch_size": "4096"})
    assert later.training.moe_dispatcher == MoeDispatcher.FLEX  # the file's HybridEP from 26.02
    assert later.release_values["moe_dispatch_nvlink_efficiency"] == 1.0


def test_gb200_rows_take_the_overlap_of_their_release():
    # 25.09: alltoall, no overlap; 26.04: HybridEP, no overlap (FP8_MX aliased GB200 V1); 26.06:
    # the file's FP8_MX preset (PR #4226: overlap on, the stack's fitted ep_overlap)
    old = build_run(ROW_546)
    assert old.training.moe_dispatcher == MoeDispatcher.ALLTOALL and old.release_values["ep_overlap"] == 0.0
    v2 = {**ROW_546, "model": "DeepSeekV3", "global_batch_size": "4096"}
    mid = build_run({**v2, "source": "Megatron-Bridge 26.04"})
    assert mid.training.moe_dispatcher == MoeDispatcher.FLEX and mid.release_values["ep_overlap"] == 0.0
    new = build_run({**v2, "source": "Megatron-Bridge 26.06"})
    assert new.training.moe_dispatcher == MoeDispatcher.FLEX and "ep_overlap" not in new.release_values


def test_rows_from_other_sources_keep_their_own_dispatcher():
    # a Megatron-Core row of release 25.11 that did not run Bridge's presets: nothing is applied
    run = build_run({**ROW_531, "source": "someone's cluster", "framework": "megatron-core 0.15"})
    assert run.training.moe_dispatcher == MoeDispatcher.ALLTOALL
    assert "ep_overlap" not in run.release_values
    assert not any("moe all-to-all" in a for a in run.assumed)
