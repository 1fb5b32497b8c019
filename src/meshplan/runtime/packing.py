"""Training on packed variable-length documents (issue 18): documents whose lengths follow the
Job's ``seq_len_dist``, assigned to the data-parallel ranks and packed into rows of S tokens with
document masks.

The assignment and the packing are the planner's own functions (cost/packing.py: ``stream_pieces``
and ``balanced_order``), so the runtime trains exactly the layout the estimate simulated. Every
rank draws the same global batch of documents for a step (generators seeded by (seed, step)) and
keeps its pieces, as runtime/data.py does for rows.

Loss: the mean next-token cross-entropy over every target of the global batch. A document's last
token has no target (``IGNORE_INDEX``); a piece cut from a longer document keeps the document's
next token as the target of its last position. Each rank divides its sum by (global targets / dp),
so that the data-parallel gradient average is the global mean, identical to one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from meshplan.cost.packing import Pieces, balanced_order, packed_segments, stream_pieces
from meshplan.runtime.models.layers import CoreAttention
from meshplan.spec.seqlen import DocBalance, SeqLenDist

IGNORE_INDEX = -100
"""Target of a position that predicts nothing (torch.nn.functional.cross_entropy's default)."""
STEP_SEED_STRIDE = 1_000_003
"""Mixes (seed, step) into one generator seed (prime, as runtime/data.py's)."""


@dataclass(frozen=True)
class DocBatch:
    """One data-parallel rank's share of a step."""

    tokens: torch.Tensor
    """(rows, S) token ids."""
    targets: torch.Tensor
    """(rows, S) next-token targets, IGNORE_INDEX after a document's last token."""
    documents: tuple[tuple[int, ...], ...]
    """Document segment lengths of each row (each sums to S)."""
    global_targets: int
    """Targets in the whole global batch (all ranks)."""


def set_documents(model: nn.Module, documents: tuple[tuple[int, ...], ...] | None) -> None:
    """Every attention core of ``model`` attends within these documents (None: whole rows)."""
    for m in model.modules():
        if isinstance(m, CoreAttention):
            m.documents = documents


def rank_pieces(lengths: np.ndarray, *, seq_len: int, rows_per_rank: int, dp: int, dp_rank: int,
                balance: DocBalance) -> Pieces:
    """The pieces of the documents ``lengths`` that rank ``dp_rank`` packs, in packing order."""
    pieces = stream_pieces(lengths, seq_len)
    if balance == DocBalance.BALANCED and dp > 1:
        pieces, ranks = balanced_order(pieces, dp, rows_per_rank, seq_len)
    else:  # stream: the packed sequences in data order, rows_per_rank of them per rank
        ranks = (np.cumsum(pieces.length) - pieces.length) // (rows_per_rank * seq_len)
    mine = ranks == dp_rank
    return Pieces(doc=pieces.doc[mine], start=pieces.start[mine], length=pieces.length[mine])


def pack(docs: list[torch.Tensor], pieces: Pieces, seq_len: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                         tuple[tuple[int, ...], ...]]:
    """(tokens, targets, documents per row) of ``pieces`` of ``docs`` packed into rows of seq_len."""
    xs, ys = [], []
    for d, s, n in zip(pieces.doc.tolist(), pieces.start.tolist(), pieces.length.tolist()):
        doc = docs[d]
        xs.append(doc[s:s + n])
        y = doc[s + 1:s + n + 1]
        if len(y) < n:  # the document ends here: its last token predicts nothing
            y = torch.cat([y, torch.full((n - len(y),), IGNORE_INDEX, dtype=doc.dtype)])
        ys.append(y)
    tokens = torch.cat(xs).view(-1, seq_len)
    targets = torch.cat(ys).view(-1, seq_len)
    seg, seq = packed_segments(pieces.length, seq_len)
    rows = tuple(tuple(int(n) for n in seg[seq == r]) for r in range(tokens.shape[0]))
    return tokens, targets, rows


@dataclass(frozen=True, kw_only=True)
class DocumentSource:
    """Synthetic documents (uniform token ids) with lengths drawn from ``dist``."""

    dist: SeqLenDist
    seq_len: int
    global_batch: int
    vocab_size: int
    seed: int
    balance: DocBalance = DocBalance.STREAM

    def documents(self, step: int) -> list[torch.Tensor]:
        """The global batch's documents of ``step`` (exactly global_batch * seq_len tokens)."""
        mix = self.seed * STEP_SEED_STRIDE + step
        lengths = self.dist.sample(np.random.default_rng(mix), self.global_batch * self.seq_len)
        g = torch.Generator().manual_seed(mix)
        return list(torch.randint(0, self.vocab_size, (int(lengths.sum()),), generator=g).split(lengths.tolist()))

    def rank_batch(self, step: int, dp_rank: int, dp: int) -> DocBatch:
        docs = self.documents(step)
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        pieces = rank_pieces(lengths, seq_len=self.seq_len, rows_per_rank=self.global_batch // dp, dp=dp,
                             dp_rank=dp_rank, balance=self.balance)
        tokens, targets, rows = pack(docs, pieces, self.seq_len)
        return DocBatch(tokens=tokens, targets=targets, documents=rows,
                        global_targets=int(lengths.sum()) - len(docs))
