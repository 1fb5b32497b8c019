"""Collective benchmarks over a process group that this module launches (gloo on CPU, nccl on GPU).

One launch of N processes measures every group size 2..N: sub-groups are the first g ranks.
Message-size convention (see meshplan.calib.hwfit.bus_factor): all-reduce and all-to-all take the
per-rank buffer, all-gather its full output, reduce-scatter its full input, send/recv the message.
Each rank also reports its resident memory right after joining the group and importing the
runtime (the framework baseline of a training worker) and its matmul throughput while g ranks compute at once (shared cores).
"""

from __future__ import annotations

import queue as queue_mod
import resource
import socket
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshplan.errors import MeshplanError
from meshplan.profile.timing import sync, time_op
from meshplan.calib.hwfit import CollectiveOp
from meshplan.calib.hwprofile import CollectiveSample, ConcurrentSample


CPU_THREADS_PER_PROC = 1
"""torchrun's default for several CPU workers, and what `meshplan train` gives every CPU rank."""


@dataclass(frozen=True, kw_only=True)
class CollectiveConfig:
    world_size: int
    device_type: str
    message_bytes: tuple[int, ...]
    group_sizes: tuple[int, ...]
    concurrent_dim: int
    """Square matmul size of the concurrent-compute probe."""
    window_s: float
    """Length of one sustained-throughput window of that probe."""
    threads_per_proc: int


@dataclass(frozen=True, kw_only=True)
class CollectiveResult:
    samples: tuple[CollectiveSample, ...]
    concurrent: tuple[ConcurrentSample, ...]
    framework_baseline_bytes: float


def collective_config(world_size: int, device_type: str, quick: bool) -> CollectiveConfig:
    if device_type == "cuda":
        sizes = tuple(1 << e for e in (range(16, 31, 3) if quick else range(12, 32, 2)))
        return CollectiveConfig(world_size=world_size, device_type=device_type, message_bytes=sizes,
                                group_sizes=_group_sizes(world_size, quick), concurrent_dim=8192, window_s=0.3,
                                threads_per_proc=1)
    sizes = tuple(1 << e for e in ((14, 18, 22) if quick else range(12, 25, 2)))
    return CollectiveConfig(world_size=world_size, device_type=device_type, message_bytes=sizes,
                            group_sizes=_group_sizes(world_size, quick), concurrent_dim=512, window_s=0.3,
                            threads_per_proc=CPU_THREADS_PER_PROC)


def _group_sizes(world: int, quick: bool) -> tuple[int, ...]:
    if quick and world > 2:
        return (2, world)
    return tuple(range(2, world + 1))


def run_collectives(cfg: CollectiveConfig, on_progress: Callable[[str], None]) -> CollectiveResult:
    """Spawn ``cfg.world_size`` processes, run the benchmarks, return rank 0's collected result."""
    if cfg.world_size < 2:
        raise MeshplanError("collective benchmarks need at least 2 processes (--procs)")
    if cfg.device_type == "cuda" and torch.cuda.device_count() < cfg.world_size:
        raise MeshplanError(f"--procs {cfg.world_size} needs as many GPUs; "
                            f"{torch.cuda.device_count()} visible")
    result = spawn_and_collect(_worker, (cfg, _free_port()), cfg.world_size, on_progress, "collective benchmark")
    return CollectiveResult(
        samples=tuple(CollectiveSample(**s) for s in result["samples"]),
        concurrent=tuple(ConcurrentSample(**s) for s in result["concurrent"]),
        framework_baseline_bytes=result["baseline"],
    )


def spawn_and_collect(worker: Callable[..., None], args: tuple, nprocs: int,
                      on_progress: Callable[[str], None], what: str) -> Any:
    """Run ``worker(rank, *args, queue)`` in ``nprocs`` spawned processes; relay its
    ("progress", label) messages and return the payload of its ("result", payload) message."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    pc = mp.start_processes(worker, args=(*args, q), nprocs=nprocs, join=False, start_method="spawn")
    result: Any = None
    try:
        done = False
        while not done or result is None:
            try:
                done = pc.join(timeout=0.2) or done
            except mp.ProcessRaisedException as exc:
                last = str(exc).strip().splitlines()[-1]
                raise MeshplanError(f"{what} failed: {last}") from None
            except mp.ProcessExitedException as exc:
                raise MeshplanError(f"{what} worker died: {exc}") from None
            while True:
                try:
                    kind, payload = q.get(timeout=0.01)
                except queue_mod.Empty:
                    break
                if kind == "progress":
                    on_progress(payload)
                else:
                    result = payload
            if done and result is None:
                raise MeshplanError(f"{what} ended without a result")
    finally:
        for p in pc.processes:
            if p.is_alive():
                p.terminate()
    return result


def progress_steps(cfg: CollectiveConfig) -> int:
    """How many progress messages a run sends (for the progress bar total)."""
    ops_per_group = len(CollectiveOp) - 1
    return 1 + sum(ops_per_group + (1 if g == 2 else 0) for g in cfg.group_sizes)


def resident_bytes() -> float:
    """This process's resident memory now. Not ru_maxrss: a spawned child starts with its parent's
    high-water mark (Linux keeps it across fork and exec), so a profile that has already swept
    large matmuls would report the parent's peak instead of a fresh worker's baseline."""
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # not Linux: the high-water mark is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, cfg: CollectiveConfig, port: int, q: Any) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_into_tensor renamed in new torch
    torch.set_num_threads(cfg.threads_per_proc)
    backend = "nccl" if cfg.device_type == "cuda" else "gloo"
    if cfg.device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(cfg.device_type, rank) if cfg.device_type == "cuda" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=cfg.world_size)
    try:
        dist.barrier()
        # what a training worker holds before its model: torch, gloo, and the runtime's modules
        import meshplan.runtime.parallelize  # noqa: F401
        import meshplan.runtime.pipeline  # noqa: F401
        import meshplan.runtime.train  # noqa: F401

        baseline = resident_bytes()
        groups = {g: dist.new_group(list(range(g))) for g in cfg.group_sizes}
        concurrent = _concurrent(rank, cfg, device)
        if rank == 0:
            q.put(("progress", "concurrent compute"))
        samples: list[dict[str, Any]] = []
        for g in cfg.group_sizes:
            ops = list(CollectiveOp) if g == 2 else [o for o in CollectiveOp if o is not CollectiveOp.SEND_RECV]
            for op in ops:
                for nbytes in cfg.message_bytes:
                    t = _time_collective(op, g, groups[g], nbytes, rank, device) if rank < g else 0.0
                    t_max = torch.tensor([t], dtype=torch.float64)
                    dist.all_reduce(t_max, op=dist.ReduceOp.MAX)  # slowest rank sets the time
                    samples.append(asdict(CollectiveSample(op=op.value, group_size=g, message_bytes=nbytes,
                                                           time_s=float(t_max.item()))))
                if rank == 0:
                    q.put(("progress", f"{op.value} over {g}"))
        peak = torch.tensor([baseline], dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        if rank == 0:
            q.put(("result", {"samples": samples, "concurrent": concurrent, "baseline": float(peak.item())}))
            time.sleep(0.2)  # let the queue's feeder thread flush before the process exits
        dist.barrier()
    finally:
        dist.destroy_process_group()


CONCURRENT_ROUNDS = 5
"""Interleaved rounds of the concurrent-compute probe (g = 1..N, then again): a slow spell of
the host lands on every g alike instead of bending the curve of the one measured during it."""


def _concurrent(rank: int, cfg: CollectiveConfig, device: torch.device) -> list[dict[str, Any]]:
    """Sustained per-process matmul FLOP/s while the first g ranks compute together, g = 1..N.

    Sustained, not burst: each rank multiplies for a fixed window of ``cfg.window_s``, long
    enough to span many scheduler time slices, so on a shared host the figure is the share of the
    cores a long training step really gets; median over CONCURRENT_ROUNDS interleaved rounds.
    """
    d = cfg.concurrent_dim
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(d, d, device=device, dtype=dtype)
    b = torch.randn(d, d, device=device, dtype=dtype)
    torch.mm(a, b)
    rates: dict[int, list[float]] = {g: [] for g in range(1, cfg.world_size + 1)}
    for _ in range(CONCURRENT_ROUNDS):
        for g in rates:
            dist.barrier()
            rate = 0.0
            if rank < g:
                calls, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < cfg.window_s:
                    torch.mm(a, b)
                    calls += 1
                    if device.type == "cuda" and calls % 16 == 0:
                        sync(device)
                sync(device)
                rate = 2.0 * d**3 * calls / (time.perf_counter() - t0)
            total = torch.tensor([rate], dtype=torch.float64)
            dist.all_reduce(total)
            rates[g].append(float(total.item()) / g)
    return [asdict(ConcurrentSample(group_size=g, dim=d, flops_per_s_per_process=statistics.median(r)))
            for g, r in rates.items()]


def _iters(nbytes: int, device_type: str) -> int:
    target = (1 << 26) if device_type == "cpu" else (1 << 32)  # bytes moved per measurement
    return max(2, min(20, target // nbytes))


def _time_collective(op: CollectiveOp, g: int, group: Any, nbytes: int, rank: int,
                     device: torch.device) -> float:
    n = max(g, nbytes // 4 // g * g)  # fp32 elements, a multiple of g
    x = torch.rand(n, device=device)
    if op is CollectiveOp.ALL_REDUCE:
        fn = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif op is CollectiveOp.ALL_GATHER:
        shard, full = torch.rand(n // g, device=device), torch.empty(n, device=device)
        fn = lambda: dist.all_gather_into_tensor(full, shard, group=group)  # noqa: E731
    elif op is CollectiveOp.REDUCE_SCATTER:
        shard = torch.empty(n // g, device=device)
        fn = lambda: dist.reduce_scatter_tensor(shard, x, group=group)  # noqa: E731
    elif op is CollectiveOp.ALL_TO_ALL:
        y = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(y, x, group=group)  # noqa: E731
    elif not op.raw:
        fn = _tp_path_fn(op, g, group, n, device)
    else:
        return _time_send_recv(x, rank, device, _iters(nbytes, device.type)) if rank < 2 else 0.0
    dist.barrier(group=group)
    return time_op(fn, device, warmup=1, iters=_iters(nbytes, device.type), repeats=3)


TP_PATH_HIDDEN = 64
"""Hidden size of the (1, S, D) activation that the tensor-parallel path benchmarks move."""


def _tp_path_fn(op: CollectiveOp, g: int, group: Any, n: int, device: torch.device) -> Callable[[], object]:
    """TP + SP's collectives as the runtime issues them: a DTensor redistribute of a (1, S, D)
    activation between sequence shards and Replicate (all-gather) / Partial (reduce-scatter)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = DeviceMesh.from_group(group, device.type)
    seq = max(g, n // TP_PATH_HIDDEN // g * g)  # a multiple of g: even sequence shards
    if op is CollectiveOp.TP_ALL_GATHER:
        src = DTensor.from_local(torch.rand(1, seq // g, TP_PATH_HIDDEN, device=device), mesh, [Shard(1)],
                                 run_check=False)
        target = [Replicate()]
    else:
        src = DTensor.from_local(torch.rand(1, seq, TP_PATH_HIDDEN, device=device), mesh, [Partial()],
                                 run_check=False)
        target = [Shard(1)]

    def run() -> object:
        out = src.redistribute(mesh, target).to_local()
        return out.wait() if hasattr(out, "wait") else out  # functional collectives return lazily

    return run


def _time_send_recv(x: torch.Tensor, rank: int, device: torch.device, iters: int) -> float:
    """One-way time of a message between ranks 0 and 1: half of a ping-pong round trip."""
    def ping_pong() -> None:
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    ping_pong()
    sync(device)
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            ping_pong()
        sync(device)
        samples.append((time.perf_counter() - t0) / iters / 2)
    return sorted(samples)[1]
