"""Fuzz the model descriptions a command reads: a Hugging Face config.json (--model) and a
Megatron-LM command line (import --from megatron); exit 0 or 2, one ``error:`` line, never a
traceback (harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import (E, FIXTURES, FUZZ, MEGATRON_ARGS, ODD_JSON, ODD_TEXT, assert_clean, dump_json,
                           import_megatron, mutated, write)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

# ---- Hugging Face config.json -----------------------------------------------------------------------
HF_FAMILIES = ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b", "nemotron-3-nano", "qwen3-30b-a3b",
               "gpt2", "bert-large"]


@FUZZ
@given(family=st.sampled_from(HF_FAMILIES), pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans())
def test_fuzz_hf_config(family, pick, value, delete, tmp_path_factory):
    good = json.loads((FIXTURES / "hf" / family / "config.json").read_text())
    path = write(tmp_path_factory.mktemp("hf"), "config.json", dump_json(mutated(good, pick, value, delete=delete)))
    assert_clean(E + ["--model", str(path)])


# ---- import: a Megatron-LM command line with one value replaced ------------------------------------
def test_the_good_megatron_command_is_accepted():
    """The good form the property mutates: a refusal below is the mutation's."""
    assert assert_clean(import_megatron(MEGATRON_ARGS))[0] == 0


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_TEXT)
def test_fuzz_import_megatron(pick, value):
    args = list(MEGATRON_ARGS)
    args[1 + 2 * (pick % (len(args) // 2))] = value
    assert_clean(import_megatron(args))
