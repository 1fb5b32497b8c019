"""bench/heldout_terms.py's long-context slope (issue 14 item 4): rows that differ only in sequence
length, and the growth of their time per token per 1k more keys. Worked by hand."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import heldout_terms as ht

from meshplan.calib.validate import load_runs


def test_slope_per_thousand_keys_by_hand():
    # 32k -> 64k keys: measured 257 -> 394 us a token, predicted 214 -> 357 us; per 1024 keys
    # (1/32 of the 32768 more): 137 / 32 = 4.28125 us and 143 / 32 = 4.46875 us
    got = ht.series_slopes([(65536, 394e-6, 357e-6), (32768, 257e-6, 214e-6)])
    assert len(got) == 1
    assert (got[0]["from_seq"], got[0]["to_seq"]) == (32768, 65536)
    assert got[0]["measured"] == pytest.approx(4.28125e-6)
    assert got[0]["predicted"] == pytest.approx(4.46875e-6)
    assert got[0]["ratio"] == pytest.approx(137 / 143)


def test_slope_skips_rows_of_one_length_and_chains_the_rest():
    got = ht.series_slopes([(8192, 1.0, 1.0), (8192, 1.1, 1.0), (16384, 2.0, 1.5), (32768, 4.0, 2.5)])
    # (8192, 8192) carries no slope; 8192 -> 16384 from the second 8192 point (sorted: 1.1 after 1.0)
    assert [(g["from_seq"], g["to_seq"]) for g in got] == [(8192, 16384), (16384, 32768)]
    assert got[1]["measured"] == pytest.approx(2.0 / 16)
    assert got[1]["predicted"] == pytest.approx(1.0 / 16)


def test_torchtitan_context_parallel_table_is_one_series():
    """torchtitan docs/performance.md Table 2: Llama 3.1 8B on 8 GPUs at 32k / 64k / 128k / 256k with
    CP 1 / 2 / 4 / 8 keeps 32k tokens on every GPU; Table 1's 8k rows (micro-batch 2) do not."""
    runs = {r.row_id: r for r in load_runs(ROOT / "bench" / "data" / "runs_heldout.csv")[0]}
    keys = {rid: ht.series_key(runs[rid], "torchtitan-compile") for rid in ("tt-3", "tt-4", "tt-5", "tt-6", "tt-7")}
    assert len({keys[r] for r in ("tt-4", "tt-5", "tt-6", "tt-7")}) == 1
    assert keys["tt-3"] != keys["tt-4"]
    assert "32768 tokens/GPU" in keys["tt-7"]
