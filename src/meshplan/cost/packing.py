"""Packed variable-length documents: the attention work they cost, per data-parallel rank.

Documents (lengths from a :class:`~meshplan.spec.seqlen.SeqLenDist`) are packed into sequences of
S tokens by concatenation and cutting at every S (GPT-style packing, Brown et al. 2020 App. B);
a document mask keeps attention inside each document (causal within it), and position ids restart
at each document (Llama 3, Dubey et al. 2024 Sec. 3.2: "attention mask that prevents
self-attention between different documents within the same sequence").

Attention work. A query at position p of its document attends p + 1 keys, so a document of l tokens
costs l(l+1)/2 causal score entries instead of the S(S+1)/2 of a full sequence: the sum of squared
lengths. A varlen kernel (FlashAttention's ``flash_attn_varlen_func``, Dao 2023 Sec. 3) runs one
block per document, and a short document reaches less of the peak: the efficiency falloff
l / (l + h) of cost/mixers.attention_core_efficiency (h the half-efficiency length), which makes
a document's time proportional to l(l+1)/2 + l*h/2. Linear layers see S tokens either way.

Straggler. Every data-parallel rank trains its share of the global batch, and the step waits for
the slowest one (the gradient reduction is a barrier): the step pays E[max over dp ranks of a
rank's attention work], estimated here by sampling steps from the distribution (a fixed seed, so
the estimate is deterministic). Two assignments of documents to ranks:

* ``stream``: the packed sequences in data order, a contiguous block of B/dp per rank;
* ``balanced``: token- and attention-balanced: the stream's document pieces (so that both train
  the same contexts), longest first, each to the rank with the least attention work that has a
  row it fits in (every rank gets exactly B/dp rows of S tokens, so the shapes stay fixed):
  greedy longest-processing-time scheduling (Graham 1969) under a token capacity, as ByteScale
  balances the quadratic attention work of variable-length data across data-parallel ranks
  (Ge et al. 2025, "ByteScale: Efficient Scaling of LLM Training with a 2048K Context Length").

Context parallel with document masks: the zig-zag split (rank i holds chunks i and 2c-1-i of 2c)
balances a full causal sequence, not one whose documents end inside it; each packed sequence pays
the work of its busiest CP rank. Per-bucket CP (ByteScale's data-aware sharding; FlexSP, Wang et
al. 2025, sequence parallel groups sized to each sequence's length): documents of at most S/c tokens are packed into
sequences of S/c that each CP rank trains alone (no CP traffic, no zig-zag imbalance); only the
longer ones are split over the c ranks.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import numpy as np

from meshplan.spec.seqlen import SeqLenDist

SAMPLE_SEED = 0
"""Seed of the sampled steps: the estimate is a function of its inputs."""
SAMPLE_STEPS = 8
"""Global batches sampled for the expected max over ranks, at most (the spread of a max of dp
sums; 8 keep its sampling error near 1/sqrt(8) of that spread, under 1% of the step on the
distributions of bench/bench_seqlen.py)."""
SAMPLE_TOKEN_BUDGET = 2**24
"""Tokens simulated in all (fewer steps for larger batches), to bound the planner's time."""


@dataclass(frozen=True)
class Pieces:
    """Documents cut to at most S tokens, in the order they are packed: piece k is tokens
    ``start[k] .. start[k] + length[k]`` of document ``doc[k]``."""

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray


def stream_pieces(doc_lengths: np.ndarray, seq_len: int) -> Pieces:
    """The document segments of the stream packing: documents concatenated in data order and cut
    at every ``seq_len`` tokens (so no piece is longer than a sequence)."""
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    ends = np.cumsum(doc_lengths)
    seg_len, _ = packed_segments(doc_lengths, seq_len)
    seg_start = np.cumsum(seg_len) - seg_len
    doc = np.searchsorted(ends, seg_start, side="right")
    return Pieces(doc=doc, start=seg_start - (ends[doc] - doc_lengths[doc]), length=seg_len)


def piece_work(length: np.ndarray, half_seq: float) -> np.ndarray:
    """Causal attention time of whole pieces, in units of score entries: l(l+1)/2 + l*h/2."""
    length = np.asarray(length, dtype=np.float64)
    return length * (length + 1.0) / 2.0 + length * half_seq / 2.0


def balanced_order(pieces: Pieces, dp: int, rows_per_rank: int, seq_len: int) -> tuple[Pieces, np.ndarray]:
    """Pieces regrouped into ``dp`` ranks of ``rows_per_rank`` rows of ``seq_len`` tokens, rank r's
    r-th, each row exactly full (so packing the result cuts nowhere new): longest first, each to
    the rank with the fewest causal score entries l(l+1)/2 that has a row it fits in (best fit:
    the fullest such row). Only when no row can hold a piece whole is it cut, into the roomiest
    row of the least-loaded rank. Returns the reordered pieces and each one's rank. The runtime
    assigns with this same function (runtime/packing.py)."""
    order = np.argsort(-pieces.length, kind="stable")
    heap = [(0.0, r) for r in range(dp)]
    free = [[(seq_len, row) for row in range(rows_per_rank)] for _ in range(dp)]  # (room, row), sorted
    content: list[list[list[tuple[int, int, int]]]] = [[[] for _ in range(rows_per_rank)] for _ in range(dp)]
    for k in order:
        d, s, left = int(pieces.doc[k]), int(pieces.start[k]), int(pieces.length[k])
        while left:
            skipped, chosen = [], None
            while heap:
                work, r = heapq.heappop(heap)
                if free[r][-1][0] >= left:
                    chosen = (work, r)
                    break
                skipped.append((work, r))
            if chosen is None:  # no row holds it whole: the least-loaded rank takes what fits
                chosen = skipped.pop(0)
            for item in skipped:
                heapq.heappush(heap, item)
            work, r = chosen
            rooms = free[r]
            i = bisect.bisect_left(rooms, (left, -1)) if rooms[-1][0] >= left else len(rooms) - 1
            room, row = rooms.pop(i)
            take = min(left, room)
            content[r][row].append((d, s, take))
            if room > take:
                bisect.insort(rooms, (room - take, row))
            s += take
            left -= take
            if rooms:
                heapq.heappush(heap, (work + take * (take + 1.0) / 2.0, r))
    rows = [[p for row in rank for p in row] for rank in content]
    ranks = np.repeat(np.arange(dp), [len(rank) for rank in rows])
    a = np.asarray([p for rank in rows for p in rank], dtype=np.int64).reshape(-1, 3)
    return Pieces(doc=a[:, 0], start=a[:, 1], length=a[:, 2]), ranks


def packed_segments(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate pieces and cut at every ``seq_len``: the (length, sequence index) of each
    document segment of the packed sequences (a piece crossing a cut becomes two segments)."""
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    total = int(ends[-1]) if len(ends) else 0
    cuts = np.union1d(ends, np.arange(seq_len, total + 1, seq_len))
    seg_len = np.diff(np.concatenate([[0], cuts]))
    keep = seg_len > 0
    seq = (cuts - seg_len) // seq_len
    return seg_len[keep], seq[keep]


def chunk_work(lengths: np.ndarray, seq_len: int, chunk_len: int, half_seq: float, causal: bool) -> np.ndarray:
    """Attention work of the queries of every ``chunk_len``-token chunk of the packed sequences
    (chunk_len divides seq_len), keys limited to the query's document segment: a query at offset
    p of its segment sees p + 1 keys (causal) or the whole segment; plus h/2 per query."""
    seg_len, _ = packed_segments(lengths, seq_len)
    seg_end = np.cumsum(seg_len)
    seg_start = seg_end - seg_len
    total = int(seg_end[-1])
    cuts = np.union1d(seg_end, np.arange(chunk_len, total + 1, chunk_len))
    sub_len = np.diff(np.concatenate([[0], cuts])).astype(np.float64)
    sub_start = cuts - sub_len
    seg = np.searchsorted(seg_end, sub_start, side="right")  # the segment holding each sub-piece
    if causal:
        offset = sub_start - seg_start[seg]
        work = sub_len * offset + sub_len * (sub_len + 1.0) / 2.0
    else:
        work = sub_len * seg_len[seg]
    work = work + sub_len * half_seq / 2.0
    chunk = (sub_start // chunk_len).astype(np.int64)
    return np.bincount(chunk, weights=work, minlength=total // chunk_len)


@dataclass(frozen=True)
class RankWork:
    """Attention work of one sampled step, over the full-sequence work of the same tokens."""

    max_factor: float
    """The busiest data-parallel rank's (the step's critical path)."""
    mean_factor: float
    """The mean rank's (what a perfectly balanced step would pay)."""


def step_work(order_lengths: np.ndarray, *, seq_len: int, dp: int, cp: int, half_seq: float, causal: bool,
              buckets: bool) -> RankWork:
    """Work per rank when the pieces ``order_lengths`` (rank blocks in order, B/dp sequences each)
    are packed into S-token sequences and each sequence is split over ``cp`` ranks by zig-zag."""
    S = seq_len
    per_seq_full = float(piece_work(S, half_seq)) if causal else S * S + S * half_seq / 2.0
    if cp == 1:
        seq_work = chunk_work(order_lengths, S, S, half_seq, causal)
    else:
        chunks = chunk_work(order_lengths, S, S // (2 * cp), half_seq, causal).reshape(-1, 2 * cp)
        per_rank = chunks[:, :cp] + chunks[:, ::-1][:, :cp]  # zig-zag: chunks i and 2c-1-i
        plain = per_rank.sum(axis=1)
        split = cp * per_rank.max(axis=1)
        if buckets:  # only documents longer than S/c are split over the CP ranks
            seg_len, seq = packed_segments(order_lengths, S)
            long_work = np.bincount(seq, weights=np.where(seg_len > S // cp, piece_work(seg_len, half_seq), 0.0),
                                    minlength=len(plain))
            share = np.divide(long_work, plain, out=np.zeros_like(plain), where=plain > 0)
            split = plain + (split - plain) * share
        seq_work = split
    ranks = seq_work.reshape(dp, -1).sum(axis=1) / (seq_work.shape[0] // dp * per_seq_full)
    return RankWork(max_factor=float(ranks.max()), mean_factor=float(ranks.mean()))


@dataclass(frozen=True)
class DocAttention:
    """Per-plan scalars of packed documents, for the cost model (one entry per plan row)."""

    core_factor: np.ndarray
    """Attention core time of the busiest rank over the full-sequence causal time it replaces
    (document masks, varlen efficiency, CP imbalance, dp straggler)."""
    mean_factor: np.ndarray
    """The same for the mean rank: core_factor - mean_factor is the straggler's share."""
    cp_token_share: np.ndarray
    """Tokens that go through context parallel (1 unless per-bucket CP)."""


def long_token_share(dist: SeqLenDist, limit: int) -> float:
    """Share of the tokens that sit in documents longer than ``limit``."""
    lengths, counts = dist.arrays()
    tokens = lengths * counts
    return float(tokens[lengths > limit].sum() / tokens.sum())


def sampled_steps(dist: SeqLenDist, seq_len: int, global_batch: int) -> list[np.ndarray]:
    """Document lengths of the sampled global batches (deterministic)."""
    tokens = seq_len * global_batch
    steps = int(min(SAMPLE_STEPS, max(1, SAMPLE_TOKEN_BUDGET // tokens)))
    rng = np.random.default_rng(SAMPLE_SEED)
    return [dist.sample(rng, tokens) for _ in range(steps)]


def doc_attention(dist: SeqLenDist, *, seq_len: int, global_batch: int, dp: np.ndarray, cp: np.ndarray,
                  half_seq: float, causal: bool, balanced: bool, buckets: bool, ideal: bool = False) -> DocAttention:
    """``DocAttention`` for plans of data-parallel degrees ``dp`` and CP degrees ``cp`` (arrays),
    each distinct (dp, cp) pair simulated once over the same sampled steps; ``ideal``: the busiest
    rank pays the mean (the bound that gives the straggler's cost)."""
    dp = np.asarray(dp, dtype=np.int64)
    cp = np.asarray(cp, dtype=np.int64)
    steps = sampled_steps(dist, seq_len, global_batch)
    core = np.ones(len(dp))
    mean = np.ones(len(dp))
    orders: dict[int, list[np.ndarray]] = {}  # the packing order of each step, per dp degree
    for d in sorted({int(a) for a in dp}):
        orders[d] = [balanced_order(stream_pieces(docs, seq_len), d, global_batch // d, seq_len)[0].length
                     if balanced and d > 1 else docs  # stream: the documents packed as they come
                     for docs in steps]
    for d, c in sorted({(int(a), int(b)) for a, b in zip(dp, cp)}):
        works = []
        for lengths in orders[d]:
            works.append(step_work(lengths, seq_len=seq_len, dp=d, cp=c, half_seq=half_seq, causal=causal,
                                   buckets=buckets))
        rows = (dp == d) & (cp == c)
        core[rows] = np.mean([w.max_factor for w in works])
        mean[rows] = np.mean([w.mean_factor for w in works])
    share = np.ones(len(cp))
    for c in set(cp.tolist()) if buckets else ():
        share[cp == c] = long_token_share(dist, seq_len // c) if c > 1 else 1.0
    return DocAttention(core_factor=mean if ideal else core, mean_factor=mean, cp_token_share=share)
