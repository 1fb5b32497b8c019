"""Exports of hand-checked jobs against golden files (tests/golden/export/<case>.<target>.<ext>).

The golden values were checked by hand when written: e.g. GPT-3 175B has 96 layers over pp=8 x
vpp=3 = 24 virtual stages of 4 layers (Megatron's --num-layers-per-virtual-pipeline-stage 4), and
its local batch per data-parallel rank is 1536 / 24 = 64 sequences; Llama-3-8B on 16 GPUs with
micro-batch 2 and global batch 64 accumulates 64 / (16 * 2) = 2 micro-batches.
Set MESHPLAN_UPDATE_GOLDEN=1 to rewrite them after a deliberate change (then re-check by hand).
"""

import os
from pathlib import Path

import pytest

import export_cases as cases
from meshplan.errors import MeshplanError
from meshplan.export import export_job
from meshplan.export.torchtitan_cli import CURRENT_VERSION

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
EXT = {"megatron": "args", "megatron-bridge": "overrides", "torchtitan": "toml", "deepspeed": "json"}
TORCHTITAN_TOML_VERSION = "0.2.0"
"""The golden .toml files are the job-file form torchtitan read before 0.3 (kept for those)."""

EXPECTED = [
    ("gpt3_narayanan", "megatron", None),
    ("gpt3_narayanan", "torchtitan", None),
    ("gpt3_narayanan", "deepspeed", "runs 1F1B only"),
    ("llama70b_hsdp", "megatron", None),
    ("llama70b_hsdp", "torchtitan", None),
    ("llama70b_hsdp", "deepspeed", "DeepSpeed 0.19 removed"),
    ("llama8b_zero2", "megatron", None),
    ("llama8b_zero2", "torchtitan", None),
    ("llama8b_zero2", "deepspeed", None),
    ("mixtral_ep", "megatron", "--use-torch-fsdp2"),
    ("gpt3_narayanan", "megatron-bridge", None),
    ("llama70b_hsdp", "megatron-bridge", None),
    ("llama8b_zero2", "megatron-bridge", None),
    ("mixtral_ep", "megatron-bridge", "--use-torch-fsdp2"),
    ("mixtral_ep", "torchtitan", None),
    ("mixtral_ep", "deepspeed", "ZeRO stages 0-2"),
]


@pytest.mark.parametrize("case,target,refusal", EXPECTED)
def test_export_matches_golden(case, target, refusal):
    job = getattr(cases, case)()
    if refusal is not None:
        with pytest.raises(MeshplanError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
            export_job(job, target)
        return
    version = TORCHTITAN_TOML_VERSION if target == "torchtitan" else None
    text = export_job(job, target, version).text
    path = GOLDEN / f"{case}.{target}.{EXT[target]}"
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("case", ["gpt3_narayanan", "llama70b_hsdp", "llama8b_zero2", "mixtral_ep"])
def test_torchtitan_command_line_matches_golden(case):
    """torchtitan >= 0.3: the command line (--module/--config + dotted overrides)."""
    text = export_job(getattr(cases, case)(), "torchtitan", CURRENT_VERSION).text
    path = GOLDEN / f"{case}.torchtitan-{CURRENT_VERSION}.sh"
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
