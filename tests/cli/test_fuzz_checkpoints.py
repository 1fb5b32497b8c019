"""Fuzz what reads a checkpoint: train --resume, replan and export-weights over a foreign or damaged
checkpoint; exit 0 or 2, one ``error:`` line, never a traceback (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from _fuzz_harness import FUZZ, ODD_JSON, ODD_TEXT, assert_clean, cpu_job, dump_json, mutated, write
from hypothesis import given
from hypothesis import strategies as st

from meshplan import ckpt_meta

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), replan=st.booleans())
def test_fuzz_checkpoint_meta(pick, value, delete, replan, checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("ck") / "ckpt"
    shutil.copytree(checkpoint, root)
    meta = root / ckpt_meta.step_dirname(4) / ckpt_meta.META_FILENAME
    meta.write_text(dump_json(mutated(json.loads(meta.read_text()), pick, value, delete=delete)))
    cpu = root.parent / "cpu.json"
    cpu_job().save(cpu)
    assert_clean(["replan", "--checkpoint", str(root), "--gpus", "4", "--json"] if replan
                 else ["train", "--plan", str(cpu), "--checkpoint-dir", str(root), "--resume"])


def test_resume_of_a_foreign_checkpoint_is_one_line(checkpoint, tmp_path, moe_job_dict):
    """A checkpoint of another model is refused before anything starts."""
    plan = write(tmp_path, "moe.json", dump_json(moe_job_dict))
    code, err = assert_clean(["train", "--plan", str(plan), "--checkpoint-dir", str(checkpoint), "--resume"])
    assert code == 2, err


@FUZZ
@given(gpus=ODD_TEXT, memory=st.one_of(st.none(), ODD_TEXT), gpn=st.one_of(st.none(), ODD_TEXT))
def test_fuzz_replan_numbers(gpus, memory, gpn, checkpoint):
    argv = ["replan", "--checkpoint", str(checkpoint), "--gpus", gpus, "--json"]
    argv += ["--memory-gib", memory] if memory is not None else []
    argv += ["--gpus-per-node", gpn] if gpn is not None else []
    assert_clean(argv)


@pytest.mark.parametrize("size", ["1e400", "1e300", "1e-12"])
def test_regression_export_weights_shard_size(size, checkpoint, tmp_path):
    """--max-shard-gb inf raised OverflowError converting to bytes; 1e-12 GB rounded to 0 bytes."""
    code, err = assert_clean(["export-weights", str(checkpoint), str(tmp_path / "out"), "--max-shard-gb", size])
    assert code == 2 and "--max-shard-gb" in err, err


def test_regression_export_weights_damaged_checkpoint(checkpoint, tmp_path):
    """Shards that are not DCP files raised torch's UnpicklingError through the command."""
    pytest.importorskip("torch")
    code, err = assert_clean(["export-weights", str(checkpoint), str(tmp_path / "out")])
    assert code == 2 and "cannot read the checkpoint's tensors" in err, err
