"""Vocabulary parallelism over the pipeline ranks (Yeung et al. 2024, "Balancing Pipeline
Parallelism with Vocabulary Parallelism").

Without it the first pipeline rank holds the embedding and the last the LM head with its loss: at
128K-256K vocabularies the head's (T x D) @ (D x V) GEMMs and its (T x V) logits weigh several
transformer layers, and the last stage sets the pipeline's pace. With it every one of the ``pp``
ranks holds ``V / pp`` rows of both (its share ``1 / pp``; a tied head needs no second copy, the
rows of both sit on the same rank) and computes its slice of the logits for every micro-batch.

Synchronisation per micro-batch (Sec. 3 and 4): the last stage's output (T x D) goes to every
rank and the gradient of the head's input comes back summed (a broadcast and a reduce: about one
all-reduce of T x D), the softmax's max (one fp32 per token) and then its sum of exponentials with
the target's logit (two fp32 per token) are all-reduced, and the embedding's partial rows (T x D)
are reduced onto the first stage in the forward with their gradient broadcast back in the backward
(about one more all-reduce).

The paper schedules these passes between the transformer layers' (their "S" and "T" passes) to
hide them; the runtime that runs this plan (meshplan.runtime.vocab_parallel, the only stack that
can: the exporters refuse it) runs them blocking, between the forward and backward passes of
GPipe or 1F1B and around the schedule, so they are charged here as exposed time, none of it
overlapped. Its 1F1B warms up deeper to keep the passes aligned: cost.pipeline.in_flight_chunks.
"""

from __future__ import annotations

import numpy as np

from meshplan.cost import comms

SOFTMAX_MAX_BYTES_PER_TOKEN = 4
"""The vocabulary-parallel softmax's max, fp32, all-reduced first (Yeung et al. 2024, Sec. 3.1)."""
SOFTMAX_SUM_BYTES_PER_TOKEN = 2 * 4
"""Its sum of exponentials and the target's logit, fp32 each, all-reduced together after the max."""


def vocab_shares(vocab_parallel: np.ndarray, pp: np.ndarray, has_embedding, has_head) -> tuple[np.ndarray, np.ndarray]:
    """Fractions of the embedding and of the LM head a rank holds: 1/pp on every rank with
    vocabulary parallelism, else all (first / last rank) or nothing."""
    embedding, head = np.asarray(has_embedding, dtype=float), np.asarray(has_head, dtype=float)
    if not np.any(vocab_parallel):
        return embedding, head
    share = 1.0 / np.maximum(pp, 1)
    return np.where(vocab_parallel, share, embedding), np.where(vocab_parallel, share, head)


def vocab_sync_s(vocab_parallel: np.ndarray, pp: np.ndarray, tokens: np.ndarray, hidden_size: float,
                 activation_bytes: float, tp: np.ndarray, link: comms.Link) -> np.ndarray:
    """Per micro-batch: the two T x D all-reduces (head input and its gradient, embedding rows and
    theirs) and the softmax statistics' two all-reduces over the ``pp`` ranks (tp ranks split T x D)."""
    rows = tokens * hidden_size * activation_bytes / tp
    stats = (comms.all_reduce_time(tokens * SOFTMAX_MAX_BYTES_PER_TOKEN / tp, pp, link)
             + comms.all_reduce_time(tokens * SOFTMAX_SUM_BYTES_PER_TOKEN / tp, pp, link))
    t = 2.0 * comms.all_reduce_time(rows, pp, link) + stats
    return np.where(vocab_parallel, t, 0.0)
