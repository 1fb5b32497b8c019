"""Fuzz the data files an estimate reads: --seq-len-dist (histogram CSV, one length per line, JSON
lines) and --expert-load (a routing log); exit 0 or 2, one ``error:`` line, never a traceback
(harness: _fuzz_harness.py)."""

from __future__ import annotations

import json

import pytest
from _fuzz_harness import (E, EM, FUZZ, HEADER, ODD_JSON, ODD_TEXT, ROW, assert_clean, expert_log, mutated,
                           write)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

# ---- --seq-len-dist: histogram CSV, one length per line, JSON lines -----------------------------
LENGTH_CELLS = st.one_of(ODD_TEXT, st.integers(min_value=1, max_value=5000).map(str))
SEQ_LEN_LINES = st.one_of(
    st.tuples(LENGTH_CELLS, LENGTH_CELLS).map(",".join),  # a histogram row
    LENGTH_CELLS,  # a sample
    st.builds(lambda v: json.dumps({"length": v}), ODD_JSON),  # a JSON-lines record
    st.sampled_from(['{"length": 5', "[1, 2]", '"text"', "length,count", "length", "1,2,3", ",", "{}"]),
)


@FUZZ
@given(header=st.sampled_from(["length,count\n", "length\n", "", "len,cnt\n", "\ufefflength,count\n"]),
       lines=st.lists(SEQ_LEN_LINES, max_size=5), newline=st.sampled_from(["\n", "\r\n"]),
       extra=st.sampled_from([[], ["--doc-balance", "balanced"], ["--cp", "2", "--cp-buckets"]]))
def test_fuzz_seq_len_dist(header, lines, newline, extra, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("sld"), "lengths.txt", header + newline.join(lines) + newline)
    assert_clean(E + ["--model", "gpt2", "--seq-len-dist", str(path)] + extra)


# ---- --expert-load: a routing log ----------------------------------------------------------------
def test_the_good_expert_load_log_is_accepted(tmp_path):
    """The good form the property mutates: a refusal below is the mutation's."""
    assert assert_clean(EM + ["--expert-load", str(write(tmp_path, "el.jsonl", expert_log(HEADER, [ROW])))])[0] == 0


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), in_header=st.booleans(),
       steps=st.integers(min_value=0, max_value=2), cut=st.integers(min_value=0, max_value=4))
def test_fuzz_expert_load_log(pick, value, delete, in_header, steps, cut, tmp_path_factory):
    header = mutated(HEADER, pick, value, delete=delete) if in_header else HEADER
    rows = [ROW] * steps if in_header else [mutated(ROW, pick, value, delete=delete)] * max(steps, 1)
    text = expert_log(header, rows)
    path = write(tmp_path_factory.mktemp("el"), "load.jsonl", text[:len(text) - cut])
    assert_clean(EM + ["--expert-load", str(path), "--expert-placement", "balanced"])


def test_regression_expert_load_count_too_large(tmp_path):
    """A routing-log count past int64 (OverflowError in the step sums) names the line and value."""
    row = {"step": 1, "counts": [[10**30, 2, 3, 4], *ROW["counts"][1:]]}
    path = write(tmp_path, "load.jsonl", expert_log(HEADER, [row]))
    code, err = assert_clean(EM + ["--expert-load", str(path)])
    assert code == 2 and "line 2: token counts must be non-negative integers, got 10" in err and "at most 2,147,483,647" in err, err
