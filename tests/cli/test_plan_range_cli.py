"""``plan --gpus A-B`` says up front how many searches it runs, and refuses more than
MAX_GPU_COUNTS on one line before any search (session 8: 8-1000000 ran 17 searches of 2-6 s each
without a word). Through the real entry point."""

from __future__ import annotations

import pytest
from _fuzz_harness import assert_clean, run_cli

from meshplan.cli.plan_cmd import MAX_GPU_COUNTS, parse_gpu_counts

pytestmark = pytest.mark.usefixtures("no_processes")

BASE = ["plan", "--model", "gpt2", "--gpu", "h100-sxm", "--seq-len", "1024", "--global-batch", "64"]


@pytest.mark.parametrize("gpus, count, last", [("8-1000000", 17, 524288), ("1-2147483647", 31, 2**30),
                                               (",".join(str(8 * k) for k in range(1, 14)), 13, 104)])
def test_too_many_searches_are_refused_at_once(gpus, count, last):
    code, err = assert_clean(BASE + ["--gpus", gpus])
    assert code == 2 and f"{count} GPU counts" in err and f"to {last})" in err and f"at most {MAX_GPU_COUNTS}" in err


def test_the_limit_itself_is_allowed():
    counts = parse_gpu_counts("8-16384")
    assert len(counts) == MAX_GPU_COUNTS == 12 and counts[-1] == 16384


def test_a_range_says_how_many_searches_first():
    code, out, err = run_cli(BASE + ["--gpus", "8-16"])
    assert code == 0, err
    assert "2 searches, one per GPU count: 8, 16" in err
    assert "2 searches" not in out  # stdout keeps the tables


def test_json_stays_quiet_on_stderr():
    code, out, err = run_cli(BASE + ["--gpus", "8-16", "--json"])
    assert code == 0 and "searches" not in err
