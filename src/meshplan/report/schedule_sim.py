"""Simulate one training step's pipeline schedule: which (micro-batch, virtual stage) forward or
backward each pipeline rank runs, and when.

Each rank executes its operations in the order its schedule prescribes; an operation starts
when the rank is free and its inputs are ready: forward of virtual stage s needs the forward of
stage s-1 (same micro-batch), backward of s needs the backward of s+1 and its own forward
(Narayanan et al. 2021, Sec. 2.2). Orders:

- GPipe: all forwards, then all backwards.
- 1F1B (PipeDream-flush): ``p - r - 1`` warm-up forwards on rank r, then one forward / one
  backward alternately, then the remaining backwards.
- Interleaved 1F1B (Megatron-LM): micro-batches go through the rank's v chunks in groups of p;
  warm-up ``2 (p - r - 1) + (v - 1) p`` forwards, then 1F1B over (micro-batch, chunk) pairs.
- Zero bubble (Qi et al. 2024, ZB-H1): each backward splits into the input-gradient part B and
  the weight-gradient part W (half the backward each). Forwards and B follow the 1F1B (or
  interleaved) sequences, but each rank picks greedily when free: a ready B first, then the next
  forward while fewer than the 1F1B count are in flight (counted until B, as in 1F1B), and W only
  to fill time when neither is ready. With F = B = W this gives ZB-H1's bubble (p-1)(F+B-W).

Idle time between operations on a rank is the bubble. The simulator is pure Python over tiny
lists (pp * vpp * m operations), so it runs for any plan the report shows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.plan import Schedule


class OpKind(str, enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"  # whole backward, or its input-gradient half under zero bubble
    WEIGHT_GRAD = "W"  # zero bubble only: the deferred weight-gradient half


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch on one virtual stage: math, and exposed communication."""

    forward_s: float
    backward_s: float
    """Backward math including recompute."""
    forward_comm_s: float = 0.0
    backward_comm_s: float = 0.0


@dataclass(frozen=True)
class Op:
    rank: int
    stage: int
    """Virtual stage (model order); it lives on rank ``stage % pp``."""
    microbatch: int
    kind: OpKind
    start_s: float
    compute_s: float
    comm_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.compute_s + self.comm_s


@dataclass(frozen=True)
class Timeline:
    pp: int
    vpp: int
    num_microbatches: int
    schedule: Schedule
    ops: tuple[Op, ...]

    @property
    def makespan_s(self) -> float:
        return max(op.end_s for op in self.ops)

    def busy_s(self, rank: int) -> float:
        return sum(op.compute_s + op.comm_s for op in self.ops if op.rank == rank)

    def bubble_s(self, rank: int) -> float:
        """Idle time of ``rank`` between the step's start and the last rank's finish."""
        return self.makespan_s - self.busy_s(rank)


def _one_f_one_b(warmup: int, fwd: list[tuple[int, int]], bwd: list[tuple[int, int]]) -> list[tuple[OpKind, int, int]]:
    """Warm-up forwards, alternate F/B, then the remaining backwards."""
    n = len(fwd)
    warmup = min(warmup, n)
    order: list[tuple[OpKind, int, int]] = [(OpKind.FORWARD, *fwd[i]) for i in range(warmup)]
    for i in range(n - warmup):
        order.append((OpKind.FORWARD, *fwd[warmup + i]))
        order.append((OpKind.BACKWARD, *bwd[i]))
    order += [(OpKind.BACKWARD, *bwd[i]) for i in range(n - warmup, n)]
    return order


def rank_order(rank: int, pp: int, vpp: int, m: int, schedule: Schedule) -> list[tuple[OpKind, int, int]]:
    """(kind, virtual stage, micro-batch) in the order ``rank`` runs them."""
    if schedule == Schedule.GPIPE or pp == 1:
        stages = [rank + c * pp for c in range(vpp)]
        fwd = [(OpKind.FORWARD, s, mb) for mb in range(m) for s in stages]
        bwd = [(OpKind.BACKWARD, s, mb) for mb in range(m) for s in reversed(stages)]
        if schedule == Schedule.GPIPE:
            return fwd + bwd
        order = _one_f_one_b(0, [(s, mb) for _, s, mb in fwd], [(s, mb) for _, s, mb in bwd])
        warmup = 0
    elif vpp == 1:
        pairs = [(rank, mb) for mb in range(m)]
        order = _one_f_one_b(pp - rank - 1, pairs, pairs)
        warmup = min(pp - rank - 1, m)
    else:
        if m % pp:
            raise MeshplanError(f"interleaved schedule needs micro-batches ({m}) divisible by pp={pp}")
        total = m * vpp

        def chunk_mb(k: int, backward: bool) -> tuple[int, int]:
            group, within = divmod(k, pp * vpp)
            chunk = (k // pp) % vpp
            if backward:
                chunk = vpp - 1 - chunk
            return rank + chunk * pp, group * pp + within % pp

        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
        order = _one_f_one_b(warmup, [chunk_mb(k, False) for k in range(total)],
                             [chunk_mb(k, True) for k in range(total)])
    return order


def _simulate_zero_bubble(stage_times: list[StageTimes], pp: int, vpp: int, m: int) -> Timeline:
    """Greedy ZB-H1 (see the module docstring): B > F (in-flight limit) > W on each free rank,
    decided in global time order so that no rank starts an operation before it is ready."""
    n_stages = pp * vpp
    base = Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B
    fwd, bwd, limit = [], [], []
    for r in range(pp):
        order = rank_order(r, pp, vpp, m, base)
        fwd.append([(s, mb) for k, s, mb in order if k == OpKind.FORWARD])
        bwd.append([(s, mb) for k, s, mb in order if k == OpKind.BACKWARD])
        warmup = next((i for i, (k, _, _) in enumerate(order) if k != OpKind.FORWARD), len(order))
        limit.append(warmup + 1)
    done: dict[tuple[OpKind, int, int], float] = {}
    free_at = [0.0] * pp
    next_f, next_b, in_flight = [0] * pp, [0] * pp, [0] * pp
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    ops: list[Op] = []
    total = 3 * sum(len(f) for f in fwd)

    def ready(deps: list[tuple[OpKind, int, int]], r: int) -> float | None:
        if any(d not in done for d in deps):
            return None
        return max([free_at[r]] + [done[d] for d in deps])

    while len(ops) < total:
        best: tuple[float, int, OpKind, int, int, int] | None = None
        for r in range(pp):
            cands = []
            if next_b[r] < len(bwd[r]):
                s, mb = bwd[r][next_b[r]]
                deps = [(OpKind.FORWARD, s, mb)] + ([(OpKind.BACKWARD, s + 1, mb)] if s < n_stages - 1 else [])
                t = ready(deps, r)
                if t is not None:
                    cands.append((t, 0, OpKind.BACKWARD, s, mb, r))
            if next_f[r] < len(fwd[r]) and in_flight[r] < limit[r]:
                s, mb = fwd[r][next_f[r]]
                t = ready([(OpKind.FORWARD, s - 1, mb)] if s > 0 else [], r)
                if t is not None:
                    cands.append((t, 1, OpKind.FORWARD, s, mb, r))
            if pending_w[r]:
                s, mb = pending_w[r][0]
                cands.append((free_at[r], 2, OpKind.WEIGHT_GRAD, s, mb, r))
            if cands:
                c = min(cands)  # earliest start; at equal start B before F before W
                best = c if best is None or c < best else best
        if best is None:
            raise MeshplanError(f"zero-bubble schedule deadlocks for pp={pp}, vpp={vpp}, m={m}")
        start, _, kind, s, mb, r = best
        st = stage_times[s]
        if kind == OpKind.FORWARD:
            compute, comm = st.forward_s, st.forward_comm_s
            next_f[r] += 1
            in_flight[r] += 1
        elif kind == OpKind.BACKWARD:  # B carries the backward's communication
            compute, comm = st.backward_s / 2, st.backward_comm_s
            next_b[r] += 1
            in_flight[r] -= 1
            pending_w[r].append((s, mb))
        else:
            compute, comm = st.backward_s / 2, 0.0
            pending_w[r].pop(0)
        op = Op(rank=r, stage=s, microbatch=mb, kind=kind, start_s=start, compute_s=compute, comm_s=comm)
        ops.append(op)
        done[(kind, s, mb)] = op.end_s
        free_at[r] = op.end_s
    return Timeline(pp=pp, vpp=vpp, num_microbatches=m, schedule=Schedule.ZERO_BUBBLE, ops=tuple(ops))


def simulate(stage_times: list[StageTimes], pp: int, vpp: int, num_microbatches: int,
             schedule: Schedule, p2p_s: float = 0.0) -> Timeline:
    """Run the schedule; ``stage_times[s]`` is virtual stage s; ``p2p_s`` delays each hand-off."""
    n_stages = pp * vpp
    if len(stage_times) != n_stages:
        raise MeshplanError(f"{len(stage_times)} stage times for pp*vpp={n_stages} stages")
    m = num_microbatches
    if schedule == Schedule.ZERO_BUBBLE:
        return _simulate_zero_bubble(stage_times, pp, vpp, m)
    orders = [rank_order(r, pp, vpp, m, schedule) for r in range(pp)]
    done: dict[tuple[OpKind, int, int], float] = {}
    cursor = [0] * pp
    free_at = [0.0] * pp
    ops: list[Op] = []

    def ready_time(kind: OpKind, s: int, mb: int) -> float | None:
        deps: list[tuple[tuple[OpKind, int, int], float]] = []
        if kind == OpKind.FORWARD and s > 0:
            deps.append(((OpKind.FORWARD, s - 1, mb), p2p_s))
        if kind == OpKind.BACKWARD:
            deps.append(((OpKind.FORWARD, s, mb), 0.0))
            if s < n_stages - 1:
                deps.append(((OpKind.BACKWARD, s + 1, mb), p2p_s))
        t = 0.0
        for key, delay in deps:
            if key not in done:
                return None
            t = max(t, done[key] + (delay if key[1] // pp != s // pp or key[1] % pp != s % pp else 0.0))
        return t

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            if cursor[r] >= len(orders[r]):
                continue
            kind, s, mb = orders[r][cursor[r]]
            ready = ready_time(kind, s, mb)
            if ready is None:
                continue
            st = stage_times[s]
            if kind == OpKind.FORWARD:
                compute, comm = st.forward_s, st.forward_comm_s
            else:
                compute, comm = st.backward_s, st.backward_comm_s
            start = max(ready, free_at[r])
            op = Op(rank=r, stage=s, microbatch=mb, kind=kind, start_s=start, compute_s=compute, comm_s=comm)
            ops.append(op)
            done[(kind, s, mb)] = op.end_s
            free_at[r] = op.end_s
            cursor[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise MeshplanError(f"schedule {schedule.value} deadlocks for pp={pp}, vpp={vpp}, m={m}")
    return Timeline(pp=pp, vpp=vpp, num_microbatches=m, schedule=schedule, ops=tuple(ops))
