"""bench/bench_bridge_tail.py (the non-GPT-OSS tail of the Megatron-Bridge rows): the closing
per-layer overhead and the same layout's twins, checked by hand on rows 503 and 466 (Qwen3-30B
H100 fp8, pp2 vp12 mb1, GBS 1024 on 16 GPUs: 5113 tokens/s in 26.02, 9058 in 26.02.01)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_bridge_tail as bt  # noqa: E402
import bench_gptoss_blackwell as bg  # noqa: E402

from meshplan.calib.validate import load_corrected_runs  # noqa: E402
from meshplan.data.published import runs_csv  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return {r.row_id: r for r in load_corrected_runs(runs_csv("megatron-bridge"))[0]}


def test_twins_are_the_same_layout_in_another_release(runs):
    twins = bt.twins(runs["503"], list(runs.values()))
    assert [t["row_id"] for t in twins] == ["466"]
    assert twins[0]["over_tail_row"] == pytest.approx(9058 / 5113)


def test_the_closing_overhead_closes_the_row(runs):
    run = runs["503"]
    row = bt.tail_row(run)
    # 1024 sequences x 4096 tokens over 16 GPUs = 262144 tokens a GPU per step, at 5113 tokens/s
    assert row["predicted_step_s"] + row["missing_s"] == pytest.approx(262144 / 5113)
    closing = row["closing_layer_overhead_s"]
    assert closing is not None and closing > row["layer_overhead_s"]  # predicted too fast: more overhead
    step = bg._step_s(run, bg._calib(run).replace_fields(layer_overhead_s=closing))
    assert step == pytest.approx(262144 / 5113, rel=1e-6)  # the closing overhead closes the row
