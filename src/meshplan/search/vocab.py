"""Vocabulary parallelism as a searched choice (:mod:`meshplan.cost.vocab`).

It changes only how the embedding and the LM head are spread over the pipeline ranks: like an
uneven layer split, it can at most remove the even split's stage imbalance (the first and last
ranks' extra work and memory) and adds a synchronisation per micro-batch. So its variants are
scored for the same configurations the layer-split search refines (those whose even-split point,
improved by ``REFINE_SLACK`` in time and memory, or at the balanced-rank bound's time, the
even-split frontier does not dominate), with
an even layer split, and their points join the frontier.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.arrays import PlanArrays


def vocab_rows(candidate: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Rows to try with vocabulary parallelism: refinement candidates with a pipeline."""
    return np.flatnonzero(candidate & (pp > 1))


def vocab_variants(space: PlanArrays, rows: np.ndarray) -> PlanArrays:
    """The rows with vocabulary parallelism on."""
    base = space.take(rows)
    return replace(base, vocab_parallel=np.ones(len(base), dtype=bool))
