"""Tokenised data (jsonl / parquet / text / datasets directory), packing, seeded resumable order,
held-out split; the learning-rate schedule and weight-decay groups."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")

import torch  # noqa: E402

from _hf_fixtures import make_tokenizer  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.runtime.datasets import PackedSource, load_packed, pack, read_documents  # noqa: E402
from meshplan.runtime.schedule import LRSchedule, decay_groups  # noqa: E402

pytestmark = pytest.mark.runtime
DOCS = ["the cat sat", "on a mat", "dogs ran in parks"]


def test_every_format_reads_the_same_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(DOCS)))
    pq.write_table(pa.table({"text": DOCS}), tmp_path / "d.parquet")
    (tmp_path / "ds").mkdir()  # the layout of datasets' save_to_disk: Arrow stream shards
    with pa.OSFile(str(tmp_path / "ds" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as w:
            w.write_table(pa.table({"text": DOCS}))
    for name in ("d.jsonl", "d.parquet", "ds"):
        assert read_documents(tmp_path / name) == DOCS, name
    (tmp_path / "d.txt").write_text("one document\n")
    assert read_documents(tmp_path / "d.txt") == ["one document\n"]


def test_bad_data_is_one_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(MeshplanError, match=r"bad\.jsonl:2: no string field 'text'"):
        read_documents(tmp_path / "bad.jsonl")
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(MeshplanError, match="unknown data format"):
        read_documents(tmp_path / "x.csv")


def test_pack_appends_eos_and_drops_the_tail():
    seqs = pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=3, eos_id=0)
    # 1 2 3 0 | 4 5 0 6 | 7 8 9 0 -> three rows of 4 (S + 1)
    assert seqs.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]


def test_order_is_a_seeded_permutation_per_epoch_and_resumable():
    train = torch.arange(12 * 5).view(12, 5)  # 12 sequences of S + 1 = 5
    src = PackedSource(train=train, held_out=train[:0], global_batch=4, seed=3)
    epoch0 = torch.cat([src.batch(s)[0][:, 0] for s in (1, 2, 3)])  # first token identifies the row
    assert sorted(epoch0.tolist()) == list(range(0, 60, 5))  # each sequence once per epoch
    epoch1 = torch.cat([src.batch(s)[0][:, 0] for s in (4, 5, 6)])
    assert sorted(epoch1.tolist()) == sorted(epoch0.tolist()) and not torch.equal(epoch0, epoch1)
    again = PackedSource(train=train, held_out=train[:0], global_batch=4, seed=3)  # a resumed run
    assert torch.equal(again.batch(5)[0], src.batch(5)[0])
    other = PackedSource(train=train, held_out=train[:0], global_batch=4, seed=4)
    assert not torch.equal(other.batch(1)[0], src.batch(1)[0])
    x, y = src.batch(1)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_held_out_split_is_disjoint(tmp_path):
    from _hf_fixtures import write_jsonl

    make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "d.jsonl", 200)
    p = load_packed(tmp_path / "d.jsonl", tmp_path / "tok", seq_len=16, global_batch=4, vocab_size=64,
                    seed=0, eval_fraction=0.1)
    n = p.train.shape[0] + p.held_out.shape[0]
    assert p.held_out.shape[0] == round(0.1 * n) and len(p.eval_batches(100)) == p.held_out.shape[0] // 4
    with pytest.raises(MeshplanError, match="does not fit the model's vocabulary"):
        load_packed(tmp_path / "d.jsonl", tmp_path / "tok", seq_len=16, global_batch=4, vocab_size=8,
                    seed=0, eval_fraction=0.0)
    with pytest.raises(MeshplanError, match="fewer than one batch"):
        load_packed(tmp_path / "d.jsonl", tmp_path / "tok", seq_len=16, global_batch=10_000, vocab_size=64,
                    seed=0, eval_fraction=0.0)


def test_warmup_then_cosine_golden():
    s = LRSchedule(peak_lr=1.0, warmup_steps=2, total_steps=6, cosine=True, min_lr_ratio=0.1)
    # warmup: 1/2, 2/2; cosine over steps 3..6 (progress (t-2)/4): 0.1 + 0.45 (1 + cos(pi p))
    expected = [0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55,
                0.1 + 0.45 * (1 + math.cos(3 * math.pi / 4)), 0.1]
    assert [s.lr_at(t) for t in range(1, 7)] == pytest.approx(expected)
    assert LRSchedule(peak_lr=2.0, total_steps=5).lr_at(4) == 2.0  # constant by default
    with pytest.raises(MeshplanError, match="--warmup-steps"):
        LRSchedule(peak_lr=1.0, warmup_steps=7, total_steps=6)


def test_decay_groups_skip_biases_and_norms():
    from meshplan.runtime.models import build_model
    from meshplan.spec.presets import model_preset

    model = build_model(model_preset("toy-gpt").with_overrides({"num_layers": 1}), "meta")
    decay, no_decay = decay_groups(model, 0.1)
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
