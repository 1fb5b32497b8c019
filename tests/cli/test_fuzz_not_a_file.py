"""Every file option given something that is not a readable text file (missing, a folder, empty,
binary, blank, /dev/null): exit 0 or 2, one ``error:`` line, never a traceback (harness:
_fuzz_harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fuzz_harness import E, EC, EM, FUZZ, assert_clean, cpu_job, write
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

NOT_A_FILE = st.sampled_from(["missing", "dir", "empty", "binary", "blank", "dev-null"])
FILE_OPTIONS = {
    "--seq-len-dist": E + ["--model", "gpt2", "--seq-len-dist"],
    "--expert-load": EM + ["--expert-load"],
    "--cluster": EC + ["--model", "gpt2", "--cluster"],
    "--model": E + ["--model"],
    "--cluster-profile": E + ["--model", "gpt2", "--cluster-profile"],
    "estimate --plan": ["estimate", "--json", "--plan"],
    "explain": ["explain"],
    "export": ["export", "--to", "megatron"],
    "profile --show": ["profile", "--show"],
    "validate --runs": ["validate", "--runs"],
    "replan --checkpoint": ["replan", "--gpus", "4", "--checkpoint"],
    "import torchtitan": ["import", "--from", "torchtitan", "--gpu", "a100-80gb", "--gpus", "8"],
    "import megatron @file": ["import", "--from", "megatron", "--gpu", "a100-80gb", "--gpus", "8"],
    "train --plan": ["train", "--plan"],
    "train --data": ["train", "--plan", "{cpu}", "--data"],
    "train --init-from": ["train", "--plan", "{cpu}", "--init-from"],
    "train --resume": ["train", "--plan", "{cpu}", "--resume", "--checkpoint-dir"],
    "export-weights": ["export-weights", "--to", "hf"],
}


@FUZZ
@given(option=st.sampled_from(sorted(FILE_OPTIONS)), kind=NOT_A_FILE)
def test_fuzz_not_a_file(option, kind, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nf")
    cpu = tmp / "cpu.json"
    cpu_job().save(cpu)
    target = {"missing": tmp / "missing.json", "dir": tmp, "empty": write(tmp, "e.json", ""),
              "binary": write(tmp, "b.json", b"\x89PNG\r\n\x1a\n\x00" + bytes(range(256))),
              "blank": write(tmp, "w.json", " \n\n"), "dev-null": Path("/dev/null")}[kind]
    argv = [a.replace("{cpu}", str(cpu)) for a in FILE_OPTIONS[option]]
    arg = f"@{target}" if option.endswith("@file") else str(target)
    argv = argv + [arg] + ([str(tmp / "out")] if option == "export-weights" else [])
    assert_clean(argv)
