"""llm-foundry's loss memory (frameworks.json llm-foundry: flash-attn's fused cross entropy keeps
the bf16 logits and writes a bf16 gradient: 2 + 2 bytes per logit, where torchtitan's fp32
log-softmax holds 4 + 8). By hand for MPT-760M at micro-batch 96 x 512 tokens, vocabulary 50368
padded to 50432 (Calibration.vocab_pad_multiple 128) on one of 8 GPUs (FSDP, no TP):
49,152 x 50,432 = 2.479e9 logits, 4 bytes each = 9.23 GiB, 12 bytes each = 27.7 GiB."""

from pathlib import Path

import pytest

from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost.step import estimate
from meshplan.spec.frameworks import framework_defaults

HELDOUT = Path(__file__).resolve().parents[2] / "bench" / "data" / "runs_heldout.csv"
LOGITS = 96 * 512 * 50432


def test_llm_foundry_holds_bf16_logits_and_gradient():
    s = framework_defaults("llm-foundry").settings
    assert (s["logits_bytes_per_element"], s["loss_transient_bytes_per_element"]) == (2.0, 2.0)
    assert "logits_bytes_per_element" not in framework_defaults("torchtitan-compile").settings


def _logits_gib(row_id: str, **fields) -> float:
    run = next(r for r in load_runs(HELDOUT)[0] if r.row_id == row_id)
    calib = setting_calibration(run, None, {**run.settings, **run.release_values, **fields})
    return estimate(run.model, run.cluster, run.training, run.plan, calib).memory.logits_bytes / 2**30


def test_mpt_logits_by_hand():
    # lf-a100-80gb-44: MPT-760M, 8 x A100 80GB, micro-batch 96 at 512 tokens
    assert _logits_gib("lf-a100-80gb-44") == pytest.approx(LOGITS * 4 / 2**30, rel=1e-3)
    torch_loss = _logits_gib("lf-a100-80gb-44", logits_bytes_per_element=4.0, loss_transient_bytes_per_element=8.0)
    assert torch_loss == pytest.approx(LOGITS * 12 / 2**30, rel=1e-3)
