"""Sequence-length distributions (spec/seqlen.py) and the packed-document cost model
(cost/packing.py, cost/data_aware.py): formats, golden work counts derived by hand, the balanced
assignment's invariants, and the estimate's response to the data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.cost import estimate
from meshplan.cost.calibration import calibration_for
from meshplan.cost.data_aware import data_aware_steps
from meshplan.cost.packing import (
    balanced_order,
    chunk_work,
    doc_attention,
    packed_segments,
    piece_work,
    step_work,
    stream_pieces,
)
from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.seqlen import DocBalance, from_samples, load_seq_len_dist
from meshplan.spec.training import TrainingSpec


# ---- the three file formats ---------------------------------------------------------------------
def test_three_formats_give_the_same_histogram(tmp_path):
    (tmp_path / "h.csv").write_text("length,count\n100,2\n7,1\n")
    (tmp_path / "s.txt").write_text("length\n100\n7\n\n100\n")
    (tmp_path / "d.jsonl").write_text('{"length": 7}\n{"length": 100, "text": "x"}\n{"length": 100}\n')
    want = (7, 100), (1, 2)
    for name in ("h.csv", "s.txt", "d.jsonl"):
        d = load_seq_len_dist(tmp_path / name)
        assert (d.lengths, d.counts) == want, name
        assert d.source == name
    assert load_seq_len_dist(tmp_path / "h.csv").mean_length == pytest.approx(207 / 3)


@pytest.mark.parametrize("text, expect", [
    ("length,count\n100,x\n", "line 2: document count 'x' is not an integer"),
    ("length,count\n100,2\n100,1\n", "line 3: length 100 listed twice"),
    ("len,n\n100,2\n", "header 'length,count'"),
    ("length,count\n0,2\n", "line 2: document length must be a positive integer"),
    ("length,count\n100,0\n", "counts no documents"),
    ("length,count\n100,2,3\n", "line 2: expected 'length,count'"),
    ("12\n-3\n", "line 2: document length must be a positive integer"),
    ("12\n4.5\n", "line 2: document length '4.5' is not an integer"),
    ('{"length": 3}\n{"tokens": 4}\n', "line 2: a JSON-lines record needs a 'length' field"),
    ('{"length": 3}\n{"length": true}\n', "line 2: length True is not an integer"),
    ('{"length": 3\n', "line 1: not JSON"),
    ("\n\n", "is empty"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path, text, expect):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(MeshplanError) as e:
        load_seq_len_dist(p)
    assert str(e.value).startswith(str(p)) and expect in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(MeshplanError, match="no such sequence-length distribution"):
        load_seq_len_dist(tmp_path / "nope.csv")


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=20), st.integers(1, 200_000), st.integers(0, 9))
def test_sample_holds_exactly_the_tokens(lengths, tokens, seed):
    d = from_samples(lengths)
    out = d.sample(np.random.default_rng(seed), tokens)
    assert out.sum() == tokens and (out >= 1).all() and (out[:-1] <= max(lengths)).all()


def test_training_round_trip_and_old_files_load():
    d = from_samples([3, 3, 900])
    t = TrainingSpec(seq_len=1024, global_batch=8, seq_len_dist=d, doc_balance="balanced", cp_buckets=True)
    assert TrainingSpec.from_dict(t.to_dict()) == t
    old = {"seq_len": 1024, "global_batch": 8, "precision": "bf16", "optimizer": "adamw"}
    assert TrainingSpec.from_dict(old).seq_len_dist is None  # a plan file from before issue 18
    with pytest.raises(MeshplanError, match="need a sequence-length distribution"):
        TrainingSpec(seq_len=1024, global_batch=8, doc_balance="balanced")
    with pytest.raises(MeshplanError, match="doc_balance"):
        TrainingSpec(seq_len=1024, global_batch=8, seq_len_dist=d, doc_balance="sorted")
    with pytest.raises(MeshplanError, match="seq_len_dist"):
        TrainingSpec.from_dict({**old, "seq_len_dist": {"lengths": [1]}})


# ---- golden work counts, by hand ----------------------------------------------------------------
def test_packing_cuts_at_every_sequence():
    seg, seq = packed_segments(np.array([3, 7]), 4)  # |aaab|bbbb|bb..: 3+1, 4, 2
    assert seg.tolist() == [3, 1, 4, 2] and seq.tolist() == [0, 0, 1, 2]
    p = stream_pieces(np.array([9, 2, 3]), 4)  # |aaaa|aaaa|abbc|cc: 9 -> 4, 4, 1; 2; 3 -> 1, 2
    assert p.doc.tolist() == [0, 0, 0, 1, 2, 2] and p.start.tolist() == [0, 4, 8, 0, 0, 1]
    assert p.length.tolist() == [4, 4, 1, 2, 1, 2]


def test_causal_work_is_the_sum_of_triangles():
    # one sequence of 8 tokens holding documents of 3 and 5: 3*4/2 + 5*6/2 = 6 + 15 = 21 score entries
    assert chunk_work(np.array([3, 5]), 8, 8, 0.0, True).tolist() == [21.0]
    assert piece_work(8, 0.0) == 36.0  # the full sequence: 8*9/2
    assert piece_work(8, 4.0) == 36.0 + 16.0  # + l*h/2: the kernel's falloff on short documents
    # non-causal: each query sees its whole document: 3*3 + 5*5
    assert chunk_work(np.array([3, 5]), 8, 8, 0.0, False).tolist() == [34.0]


def test_zigzag_balances_one_document_not_two():
    # S=8, c=2: chunks of 2; one document: chunk works 1+2, 3+4, 5+6, 7+8 = 3, 7, 11, 15
    chunks = chunk_work(np.array([8]), 8, 2, 0.0, True)
    assert chunks.tolist() == [3.0, 7.0, 11.0, 15.0]  # rank 0: 3+15, rank 1: 7+11: 18 each
    one = step_work(np.array([8]), seq_len=8, dp=1, cp=2, half_seq=0.0, causal=True, buckets=False)
    assert one.max_factor == pytest.approx(1.0)
    # documents 4 and 4: chunks 1+2, 3+4, 1+2, 3+4 -> ranks 3+7, 7+3: still 10 each, work 20/36
    two = step_work(np.array([4, 4]), seq_len=8, dp=1, cp=2, half_seq=0.0, causal=True, buckets=False)
    assert two.max_factor == pytest.approx(20 / 36)
    # documents 2 and 6: chunks 3, 1+2, 3+4, 5+6 = 3, 3, 7, 11 -> ranks 3+11=14, 3+7=10: the work is
    # 24, but the sequence takes as long as its busiest CP rank: 2*14 (one dp rank: mean = max)
    skew = step_work(np.array([2, 6]), seq_len=8, dp=1, cp=2, half_seq=0.0, causal=True, buckets=False)
    assert skew.max_factor == pytest.approx(28 / 36) == pytest.approx(skew.mean_factor)
    # per-bucket CP: the 2-token document (<= S/c = 4) is no CP work; the 6 keeps its imbalance share
    bucketed = step_work(np.array([2, 6]), seq_len=8, dp=1, cp=2, half_seq=0.0, causal=True, buckets=True)
    assert bucketed.max_factor == pytest.approx((24 + 4 * 21 / 24) / 36)


def test_dp_straggler_is_the_busiest_rank():
    # two ranks, one 8-token sequence each: [8] (36) and [4,4] (20): max 36, mean 28
    w = step_work(np.array([8, 4, 4]), seq_len=8, dp=2, cp=1, half_seq=0.0, causal=True, buckets=False)
    assert w.max_factor == pytest.approx(1.0) and w.mean_factor == pytest.approx(28 / 36)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.sampled_from([1, 2, 3, 4]))
def test_balanced_assignment_keeps_tokens_and_documents(lengths, dp):
    S = 8
    total = sum(lengths)
    seqs = -(-total // (S * dp)) * dp  # pad the batch so that it divides into dp ranks
    docs = np.array(lengths + ([seqs * S - total] if seqs * S > total else []))
    pieces = stream_pieces(docs, S)
    order, ranks = balanced_order(pieces, dp, seqs // dp, S)
    assert np.bincount(ranks, weights=order.length, minlength=dp).tolist() == [seqs // dp * S] * dp
    assert np.bincount(order.doc, weights=order.length).tolist() == docs.tolist()  # every token once
    assert (order.length <= S).all()


@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=80), st.sampled_from([2, 4]))
def test_balanced_rows_keep_every_piece_whole(sizes, dp):
    """On documents of power-of-two sizes the balanced layout keeps every stream piece whole (best
    fit, longest first), so it trains exactly the stream's contexts: what the runtime's parity test
    against one process relies on."""
    S = 8
    total = sum(sizes)
    seqs = -(-total // (S * dp)) * dp
    docs = np.array(sizes + [1] * (seqs * S - total))
    pieces = stream_pieces(docs, S)
    order, _ = balanced_order(pieces, dp, seqs // dp, S)
    seg, _ = packed_segments(order.length, S)
    assert sorted(seg.tolist()) == sorted(pieces.length.tolist())


def test_balancing_lowers_the_busiest_rank():
    d = from_samples([64] * 200 + [4096] * 6)
    kw = dict(seq_len=4096, global_batch=32, dp=np.array([8]), cp=np.array([1]), half_seq=0.0, causal=True,
              buckets=False)
    stream = doc_attention(d, balanced=False, **kw)
    bal = doc_attention(d, balanced=True, **kw)
    assert bal.core_factor[0] < stream.core_factor[0]
    assert bal.core_factor[0] >= bal.mean_factor[0]


def test_full_length_documents_change_nothing():
    d = from_samples([2048])
    r = doc_attention(d, seq_len=2048, global_batch=16, dp=np.array([1, 4, 8, 4]), cp=np.array([1, 1, 1, 2]),
                      half_seq=512.0, causal=True, balanced=True, buckets=False)
    assert np.allclose(r.core_factor, 1.0) and np.allclose(r.mean_factor, 1.0)


def test_half_length_documents_golden():
    # documents of S/2, h = 0: two triangles (S/2)(S/2+1)/2 over S(S+1)/2 = (S/2+1)/(S+1)
    S = 1024
    r = doc_attention(from_samples([S // 2]), seq_len=S, global_batch=8, dp=np.array([1, 8]), cp=np.array([1, 1]),
                      half_seq=0.0, causal=True, balanced=False, buckets=False)
    assert np.allclose(r.core_factor, (S / 2 + 1) / (S + 1))


# ---- the estimate -------------------------------------------------------------------------------
MODEL = model_preset("llama3-8b")
CLUSTER = system_preset("dgx-h100").with_gpus(16)
TRAIN = TrainingSpec(seq_len=8192, global_batch=64)
SKEWED = from_samples([256] * 3000 + [1024] * 800 + [32768] * 12)


def _step(training, plan: Plan | None = None):
    plan = plan or Plan(dims=ParallelDims(dp_replicate=16))
    return estimate(MODEL, CLUSTER, training, plan, calibration_for(CLUSTER.gpu)).step_time_s


def test_estimate_follows_the_documents():
    full = _step(TRAIN)
    assert _step(replace(TRAIN, seq_len_dist=from_samples([8192]))) == pytest.approx(full, rel=1e-12)
    stream = _step(replace(TRAIN, seq_len_dist=SKEWED))
    balanced = _step(replace(TRAIN, seq_len_dist=SKEWED, doc_balance=DocBalance.BALANCED))
    bound = _step(replace(TRAIN, seq_len_dist=SKEWED, doc_balance=DocBalance.IDEAL))
    assert bound <= balanced < stream < full


def test_per_bucket_cp_saves_cp_traffic():
    plan = Plan(dims=ParallelDims(dp_replicate=8, cp=2))
    t = replace(TRAIN, seq_len_dist=SKEWED)
    steps = data_aware_steps(MODEL, CLUSTER, t, plan, calibration_for(CLUSTER.gpu))
    assert steps.aware_s < steps.fixed_s < steps.full_sequences_s
    assert steps.chosen_s == pytest.approx(steps.fixed_s) and steps.straggler_s > 0
    bucketed = estimate(MODEL, CLUSTER, replace(t, cp_buckets=True), plan, calibration_for(CLUSTER.gpu))
    plain = estimate(MODEL, CLUSTER, t, plan, calibration_for(CLUSTER.gpu))
    assert bucketed.time.exposed_cp_s < plain.time.exposed_cp_s


def test_job_file_carries_the_distribution(tmp_path):
    t = replace(TRAIN, seq_len_dist=SKEWED, doc_balance=DocBalance.BALANCED)
    job = Job(model=MODEL, training=t, cluster=CLUSTER, plan=Plan(dims=ParallelDims(dp_replicate=16)))
    job.save(tmp_path / "j.json")
    assert Job.load(tmp_path / "j.json").training == t


@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
       st.booleans(), st.booleans(), st.sampled_from([0.0, 256.0]))
def test_documents_never_cost_more_than_full_sequences(lengths, dp, cp, balanced, buckets, half):
    """A document mask only removes score entries, and the zig-zag split of a full sequence is
    exactly balanced: every factor lies in (0, 1], the busiest rank at least the mean."""
    r = doc_attention(from_samples(lengths), seq_len=1024, global_batch=8, dp=np.array([dp]), cp=np.array([cp]),
                      half_seq=half, causal=True, balanced=balanced, buckets=buckets)
    assert 0 < r.mean_factor[0] <= r.core_factor[0] <= 1 + 1e-12
    assert 0 <= r.cp_token_share[0] <= 1
