"""Packed variable-length documents (issue 18): the document mask and the dp assignment against
one process on the same documents.

* in one process: a packed row with its document layout gives, per token, the loss each document
  gives alone (positions restart, nothing crosses a document), and the ranks' pieces cover every
  target of the global batch once, whichever assignment;
* multi-process (gloo): dp=2 with stream and with balanced assignment train the losses and the
  final weights of one process on the same documents.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _configs import GLOBAL_BATCH, LR, MODELS, SEQ_LEN

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.runtime.models.transformer import build_model
from meshplan.runtime.packing import (
    IGNORE_INDEX,
    DocumentSource,
    rank_pieces,
    set_documents,
)
from meshplan.runtime.testing import parity_errors, run_jobs, single_process
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.seqlen import DocBalance, from_samples
from meshplan.spec.training import Optimizer, TrainingSpec

DIST = from_samples([1, 2, 2, 4, 4, 4, 8, 8, 16, 16, 16, 48])
"""Power-of-two lengths (and one over S=16): the balanced rows keep every stream piece whole
(tests/planner/test_seqlen.py), so balanced and stream train the same contexts."""
STEPS = 3


def _model():
    torch.manual_seed(0)
    model = build_model(MODELS["llama"], "cpu")
    model.init_weights(0)
    return model


def _token_losses(model, tokens, targets):
    """Cross-entropy per token, flattened row-major (0 where the target is ignored)."""
    logits = model(tokens)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")


@pytest.mark.parametrize("balance", [DocBalance.STREAM, DocBalance.BALANCED])
def test_packed_rows_equal_documents_alone(balance):
    model = _model()
    source = DocumentSource(dist=DIST, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, vocab_size=256, seed=3,
                            balance=balance)
    docs = source.documents(1)
    lengths = np.array([len(d) for d in docs])
    dp = 2
    targets_seen = 0
    with torch.no_grad():
        for rank in range(dp):
            batch = source.rank_batch(1, rank, dp)
            set_documents(model, batch.documents)
            packed = _token_losses(model, batch.tokens, batch.targets)
            set_documents(model, None)
            unmasked = _token_losses(model, batch.tokens, batch.targets)
            alone = []
            pieces = rank_pieces(lengths, seq_len=SEQ_LEN, rows_per_rank=GLOBAL_BATCH // dp, dp=dp, dp_rank=rank,
                                 balance=balance)
            for d, s, n in zip(pieces.doc.tolist(), pieces.start.tolist(), pieces.length.tolist()):
                y = docs[d][s + 1:s + n + 1]
                y = torch.cat([y, torch.full((n - len(y),), IGNORE_INDEX)])
                alone.append(_token_losses(model, docs[d][s:s + n][None], y[None]))
            alone = torch.cat(alone)  # the pieces in packing order: the rows' tokens, row-major
            assert torch.allclose(packed, alone, atol=1e-5), (rank, (packed - alone).abs().max())
            assert not torch.allclose(unmasked, alone, atol=1e-3)  # the mask is what makes them equal
            targets_seen += int((batch.targets != IGNORE_INDEX).sum())
    assert targets_seen == batch.global_targets == int(lengths.sum()) - len(docs)


def _job(balance: DocBalance, **plan_fields) -> Job:
    dims = ParallelDims(**plan_fields.pop("dims", {}))
    training = TrainingSpec(seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, optimizer=Optimizer.SGD,
                            seq_len_dist=DIST, doc_balance=balance)
    return Job(model=MODELS["llama"], training=training, cluster=resolve_cluster("cpu", gpus=dims.world_size),
               plan=Plan(dims=dims, **plan_fields))


@pytest.mark.runtime
def test_dp2_packed_documents_match_one_process(tmp_path):
    jobs = [_job(DocBalance.STREAM, dims=dict(dp_replicate=2), micro_batch=2),
            _job(DocBalance.BALANCED, dims=dict(dp_shard=2), zero=3)]
    (tmp_path / "dp2").mkdir()
    (tmp_path / "ref").mkdir()
    got = run_jobs(jobs, steps=STEPS, lr=LR, tmp_path=tmp_path / "dp2")
    ref = run_jobs([single_process(jobs[0])], steps=STEPS, lr=LR, tmp_path=tmp_path / "ref")[0]
    for name, result in zip(("stream dp2", "balanced fsdp2"), got):
        errors = parity_errors(result, ref)
        assert not errors, f"{name}: " + "; ".join(errors[:5])
    assert all(l > 0 for l in ref.losses) and ref.losses[0] != ref.losses[-1]  # it trains
