"""`meshplan validate` per stack, with bias breakdowns, refits written as data and held-out
scores (issue 14, items 6 and 7), through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.calib.fit import fit_all
from meshplan.calib.holdout import leave_one_out
from meshplan.calib.records import write_records
from meshplan.calib.validate import load_runs
from meshplan.cost.calibration import FITTED_FILE
from meshplan.data.published import runs_csv

SRC = Path(__file__).resolve().parents[2] / "src"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_bridge_json_breaks_the_signed_error_down_and_meets_the_shipped_fit():
    r = run("validate", "--runs", "megatron-bridge", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    by = d["signed_error_by"]
    assert {"fp8", "fp4", "bf16"} <= set(by["precision"]) and set(by["dense_moe"]) == {"dense", "moe"}
    assert {"hopper", "blackwell", "blackwell-ultra"} == set(by["generation"]) and "h100-sxm" in by["gpu"]
    rows = [x for x in d["rows"] if x["error"] is not None]
    moe = sorted(x["error"] for x in rows if x["moe"])
    assert by["dense_moe"]["moe"]["median_signed_error"] == pytest.approx(
        (moe[(len(moe) - 1) // 2] + moe[len(moe) // 2]) / 2)
    assert all(x["stack"] == "megatron" for x in rows)
    # the fitted hopper/blackwell megatron records are what makes this hold (61.7% before them)
    # a regression guard on the shipped fit (15.4% after the per-op mechanisms were fitted, on
    # TFLOP/s; 8.1% on tokens/s after the attention, grouped-GEMM, host-launch and SSD
    # mechanisms and the Blackwell Ultra records; 9.0% after cross-domain rings ran at the
    # node's NICs, which took the worst rows from -83% / -68% to +11% / -2%; 7.8% / 32.4% once a
    # MoE layer's whole forward, not its MoE block alone, waited for the host after the
    # all-to-all's sync; 6.8% / 32.4% with a fixed time per local expert's GEMM; 6.5% / 28.2% once
    # a row's stack release selects what its presets run (spec/stack_version.py: full-iteration
    # CUDA graphs and fused grouped MLPs in the 26.06 Qwen3 / DeepSeek-V3 presets); issue 14 aims at 8%;
    # 7.0% when more presets' dispatchers were read (HybridEP / DeepEP) on the fit made before
    # them; 4.2% / 18.4% after the fit's restarted descent (calib/fit_search.py) refit on all of
    # session 8's mechanisms (docs/accuracy.md, session 8); 5.5% / 21.2% once every fitted field
    # stays in its physical range with a weak prior (calib/priors.py: no NVLink at 40% of its
    # rate, no NIC at 100%), which took the held-out runs from 7.9% / 18.9% to 7.1% / 18.3%
    # (docs/accuracy.md, "Bounds and priors"); the p90 above issue 14's 20% is GPT-OSS on Blackwell
    assert d["summary"]["throughput_median_abs_error"] <= 0.06
    assert d["summary"]["throughput_p90_abs_error"] <= 0.22


def test_target_replaces_each_rows_stack():
    r = run("validate", "--runs", "megatron-bridge", "--target", "meshplan", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {x["stack"] for x in d["rows"]} == {"meshplan"}
    base = json.loads(run("validate", "--runs", "megatron-bridge", "--json").stdout)
    assert d["summary"]["throughput_median_abs_error"] != base["summary"]["throughput_median_abs_error"]


@pytest.mark.parametrize("args, message", [(("--write-calibration",), "--write-calibration needs --fit"),
                                           (("--target", "nemo"), "nemo")])
def test_bad_flags_are_one_line_exit_2(args, message):
    r = run("validate", "--runs", "calibration", *args)
    assert r.returncode == 2 and message in r.stderr


def test_write_records_replaces_only_the_fitted_pairs(tmp_path):
    runs, _ = load_runs(runs_csv("calibration"))
    v100 = [r for r in runs if r.cluster.gpu.name.startswith("v100")]
    fits = fit_all(v100, dict(v100[0].settings), memory_grid={})
    assert set(fits) == {"volta/megatron"}
    path = tmp_path / "fitted.json"
    path.write_text((SRC / "meshplan" / "spec" / FITTED_FILE).read_text())
    before = json.loads(path.read_text())
    write_records(fits, "calibration", path)
    after = json.loads(path.read_text())
    assert {k: v for k, v in after["records"].items() if k != "volta/megatron"} == \
        {k: v for k, v in before["records"].items() if k != "volta/megatron"}
    rec = after["records"]["volta/megatron"]
    assert rec["values"] == {k: float(v) for k, v in fits["volta/megatron"].values.items()}
    assert "fitted on calibration" in rec["source"] and "4 rows" in rec["how"]
    assert after["stacks"] == before["stacks"]


def test_leave_one_generation_out_scores_rows_with_a_fit_that_never_saw_them():
    """Hold out Volta: its 4 rows are scored by a fit made on Ampere rows only (pooled for the
    stack), and vice versa; each held-out row is predicted exactly once."""
    runs, _ = load_runs(runs_csv("calibration"))
    a100 = [r for r in runs if r.cluster.gpu.name.startswith("a100") and r.metric and r.stack == "megatron"][:12]
    v100 = [r for r in runs if r.cluster.gpu.name.startswith("v100")]
    held = leave_one_out(a100 + v100, "generation", dict(v100[0].settings))
    assert set(held.groups) == {"ampere", "volta"}
    assert held.groups["volta"]["rows"] == 4 and held.groups["ampere"]["rows"] == 12
    assert len(held.errors) == 16 and held.summary()["median_abs_error"] > 0


LLAMA70 = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "64", "--tp", "8", "--pp", "4",
           "--seq-len", "8192", "--global-batch", "1024"]


def test_estimate_takes_the_stack_through_target():
    """Same plan, two stacks: Megatron-Core's fitted Hopper record and overlaps against
    meshplan's runtime (the default)."""
    out = {}
    for target in ("meshplan", "megatron"):
        r = run("estimate", *LLAMA70, "--target", target, "--json")
        assert r.returncode == 0, r.stderr
        out[target] = json.loads(r.stdout)
        assert out[target]["target"] == target
    assert "hopper/megatron" in out["megatron"]["calibration_source"] or \
        "megatron-bridge" in out["megatron"]["calibration_source"]
    assert out["megatron"]["step_time_s"] != out["meshplan"]["step_time_s"]
    assert json.loads(run("estimate", *LLAMA70, "--json").stdout)["step_time_s"] == out["meshplan"]["step_time_s"]
    bad = run("estimate", *LLAMA70, "--target", "nemo")
    assert bad.returncode == 2


def test_fit_settings_name_what_the_frameworks_disagree_on():
    from types import SimpleNamespace

    from meshplan.calib.fit import shared_settings as fit_settings
    from meshplan.errors import MeshplanError
    from meshplan.spec.frameworks import framework_defaults

    old, new = (SimpleNamespace(settings=framework_defaults(n).settings) for n in ("megatron-lm", "megatron-core"))
    assert fit_settings([old, old], {}) == framework_defaults("megatron-lm").settings
    with pytest.raises(MeshplanError, match="differ in activation_offload_overlap, dropout, fp8_param_gather, fused_attention, "
                                            "grad_bytes_per_param_bf16, moe_routed_copies_kept, pp_p2p_overlap, tp_overlap"):
        fit_settings([old, new], {})
