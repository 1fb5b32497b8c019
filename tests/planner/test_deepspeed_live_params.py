"""DeepSpeed ZeRO-3's gathered parameters under its config defaults (Calibration.zero3_max_live_params
1e9, zero3_prefetch_bucket_params 5e7; deepspeed/runtime/zero/config.py@1b88ac3): the current
module and what the prefetch holds ahead, not torch FSDP's two whole layers.

By hand, Narayanan et al. 2021 Table 2's ZeRO-3 rows (GPT, no TP, bf16/fp16 gathers of 2 B):
* row 12 (175B, D 12288, F 49152): the largest module is the h -> 4h linear, 12288 x 49152 =
  603,979,776 elements, above the bucket, so one whole next module beside it: 2 x 603,979,776 x 2 B
  = 2,415,919,104 B (2.25 GiB; two layers were 6.73 GiB).
* row 15 (530B, D 20480, F 81920): m = 20480 x 81920 = 1,677,721,600 > the 1e9 cap, the window is
  m + 1e9: 2,677,721,600 x 2 B = 5,355,443,200 B (4.99 GiB; two layers were 18.7 GiB).
"""

import pytest

from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost.calibration import Calibration
from meshplan.cost.memory import deepspeed_live_params
from meshplan.cost.step import estimate
from meshplan.data.published import runs_csv
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.model import ModelSpec

DS = Calibration(zero3_max_live_params=1e9, zero3_prefetch_bucket_params=5e7)


def _gathered_bytes(row_id: str) -> float:
    run = next(r for r in load_runs(runs_csv("calibration"))[0] if r.row_id == row_id)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values})
    return estimate(run.model, run.cluster, run.training, run.plan, calib).memory.gathered_weight_bytes


@pytest.mark.parametrize(("row_id", "want"), [("12", 2_415_919_104), ("15", 5_355_443_200)])
def test_narayanan_zero3_rows_gather_a_module_window(row_id, want):
    assert _gathered_bytes(row_id) == pytest.approx(want)


def test_small_modules_fill_the_window_to_the_cap():
    # D 1024, F 4096: m = 4,194,304 < the 5e7 bucket, so the prefetch runs up to the 1e9 cap
    small = ModelSpec(name="s", num_layers=24, hidden_size=1024, num_heads=16, vocab_size=50304)
    assert deepspeed_live_params(small, DS, 1) == pytest.approx(4_194_304 + 1e9)
    # under TP 2 each rank's module is half as large
    big = ModelSpec(name="b", num_layers=96, hidden_size=12288, num_heads=96, vocab_size=51200)
    assert deepspeed_live_params(big, DS, 2) == pytest.approx(2 * 301_989_888)


def test_only_the_deepspeed_stacks_gather_by_module():
    for name in ("deepspeed", "deepspeed-2021"):
        assert framework_defaults(name).settings["zero3_max_live_params"] == 1e9
    for name in ("torchtitan", "llm-foundry", "pytorch-fsdp", "megatron-core"):
        assert not framework_defaults(name).settings.get("zero3_max_live_params", 0.0)
