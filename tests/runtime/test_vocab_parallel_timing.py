"""Where the vocabulary-parallel output passes sit in GPipe and 1F1B (runtime/vocab_parallel.py),
checked on a unit-time simulation of the schedule (no processes): every rank's order of forwards,
backwards and output passes runs to the end (no rank waits on one that waits on it) and the step
is as long as the pipeline's plus the output passes, not a pipeline run one stage at a time."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshplan.runtime.vocab_parallel import output_lag, pass_order  # noqa: E402

F, B, H = 1.0, 2.0, 0.5
"""A forward, a backward and an output pass (1/pp of the head on each rank), in time units."""


def simulate(m: int, pp: int, one_f_one_b: bool, lag=output_lag, order=pass_order) -> float:
    """Makespan of one step; raises if the ranks deadlock. Forward k on rank r waits for forward k
    on r - 1; backward k for backward k on r + 1 (the last rank for output pass k); output pass i
    starts when every rank has reached it."""
    seqs = []
    for r in range(pp):
        seq, done, lag_r = [], 0, lag(m, pp, r, one_f_one_b=one_f_one_b)
        for fwd, k in order(m, pp, r, one_f_one_b=one_f_one_b):
            seq.append(("F" if fwd else "B", k))
            if fwd:
                due = m if k == m - 1 else max(0, k - lag_r + 1)
                seq += [("P", i) for i in range(done, due)]
                done = max(done, due)
        seqs.append(seq)
    end: dict[tuple, float] = {}  # (kind, k, rank) -> finish time
    clock, pos = [0.0] * pp, [0] * pp
    while any(pos[r] < len(seqs[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while pos[r] < len(seqs[r]):
                kind, k = seqs[r][pos[r]]
                if kind == "P":
                    if not all(pos[q] < len(seqs[q]) and seqs[q][pos[q]] == ("P", k) for q in range(pp)):
                        break
                    t = max(clock) + H
                    for q in range(pp):
                        clock[q], pos[q] = t, pos[q] + 1
                        end[("P", k, q)] = t
                    progressed = True
                    continue
                dep = (("F", k, r - 1) if r > 0 else None) if kind == "F" else \
                      (("B", k, r + 1) if r < pp - 1 else ("P", k, r))
                if dep is not None and dep not in end:
                    break
                start = max(clock[r], end[dep] if dep else 0.0)
                clock[r] = start + (F if kind == "F" else B)
                end[(kind, k, r)] = clock[r]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise AssertionError(f"deadlock: {[seqs[r][pos[r]] if pos[r] < len(seqs[r]) else None for r in range(pp)]}")
    return max(clock)


def one_f_one_b_order(m: int, pp: int, rank: int, *, one_f_one_b: bool) -> list[tuple[bool, int]]:
    """torch's own 1F1B order (warm-up pp - rank), to show what the deeper warm-up is for."""
    warmup = min(m, pp - rank)
    order = [(True, k) for k in range(warmup)]
    for k in range(m):
        order.append((False, k))
        if warmup + k < m:
            order.append((True, warmup + k))
    return order


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [8, 16, 32])
@pytest.mark.parametrize("one_f_one_b", [False, True])
def test_output_passes_keep_the_pipeline(pp: int, m: int, one_f_one_b: bool) -> None:
    pipeline = (m + pp - 1) * (F + B)  # GPipe and 1F1B without the passes
    t = simulate(m, pp, one_f_one_b)
    assert t >= pipeline + m * H
    # the passes (H each, on every rank) and at most a few forwards of alignment at the ends
    assert t <= pipeline + m * H + 2 * pp * F


def _or_deadlock(m: int, pp: int, lag) -> float:
    try:
        return simulate(m, pp, True, order=one_f_one_b_order, lag=lag)
    except AssertionError:  # deadlock
        return float("inf")


@pytest.mark.parametrize("pp", [4, 8])
def test_torch_1f1b_warmup_would_chain_the_backwards(pp: int) -> None:
    """The check above can fail: with torch's 1F1B warm-up (pp - r) the passes cost a forward
    more per micro-batch at best, and far more placed just before each rank's own backward."""
    m = 32
    bound = (m + pp - 1) * (F + B) + m * H + 2 * pp * F
    best = min(_or_deadlock(m, pp, lambda m, pp, r, one_f_one_b, d=d: d) for d in range(pp))  # same lag d
    best = min(best, _or_deadlock(m, pp, lambda m, pp, r, one_f_one_b: (pp - r) // 2))  # aligned in time
    assert best > bound + m * F / 2
    late = simulate(m, pp, True, order=one_f_one_b_order, lag=lambda m, pp, r, one_f_one_b: pp - 1 - r)
    assert late > bound + m * F
