"""Single-device micro-benchmarks: matmul, causal attention, memory-bound bandwidth.

FLOP counts: a (m, k) x (k, n) matmul is 2*m*n*k FLOPs. Causal attention forward over (B, N, S, H)
is two matmuls (Q K^T and P V) of 2*B*N*S*S*H FLOPs each, halved by the mask (the convention of
the FlashAttention papers' benchmarks).
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshplan.profile.timing import iters_for, time_op
from meshplan.calib.hwprofile import AttentionSample, BandwidthSample, MatmulSample

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """What to measure on this device (sizes chosen so --quick ends in seconds on a laptop CPU)."""

    precisions: tuple[str, ...]
    matmul_shapes: tuple[tuple[int, int, int], ...]
    attention_shapes: tuple[tuple[int, int, int, int], ...]
    """(B, N, S, H)."""
    bandwidth_bytes: tuple[int, ...]
    budget_s: float
    """Time aimed at per measured shape."""


def sweep_plan(device: torch.device, quick: bool) -> SweepPlan:
    if device.type == "cuda":
        precisions = ["bf16", "fp16", "fp32"]
        if torch.cuda.get_device_capability(device) >= (8, 9) and hasattr(torch, "_scaled_mm"):
            precisions.append("fp8")
        squares = (1024, 4096, 8192) if quick else (256, 512, 1024, 2048, 4096, 8192, 16384)
        rect = ((16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336), (8192, 1024, 8192))
        attn = ((4, 16, 2048, 128),) if quick else ((4, 16, 1024, 128), (2, 32, 4096, 128), (1, 32, 8192, 128))
        return SweepPlan(precisions=tuple(precisions),
                         matmul_shapes=tuple((d, d, d) for d in squares) + (rect[:2] if quick else rect),
                         attention_shapes=attn, bandwidth_bytes=(1 << 30,) if quick else (1 << 28, 1 << 30),
                         budget_s=0.05 if quick else 0.2)
    squares = (64, 128, 256, 512, 1024) if quick else (32, 64, 128, 256, 512, 1024, 1536, 2048)
    rect = ((2048, 256, 1024), (512, 2048, 512), (4096, 128, 128)) if quick else \
        ((2048, 256, 1024), (512, 2048, 512), (4096, 128, 128), (4096, 512, 2048), (8192, 64, 256))
    # Causal attention over a sweep of S, also the lengths of packed documents (one SDPA call
    # per document): the forward's and the backward's falloff with S (calib/hwcalib.py).
    seqs = (16, 64, 256, 1024, 2048) if quick else (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    attn = tuple((1, 8, s, 32) for s in seqs) + ((1, 8, 512, 64),)
    return SweepPlan(precisions=("fp32",), matmul_shapes=tuple((d, d, d) for d in squares) + rect,
                     attention_shapes=attn,
                     bandwidth_bytes=(1 << 25,) if quick else (1 << 25, 1 << 27, 1 << 28),
                     # windows of 50-100 ms: long enough to see the share of the cores a training
                     # step gets on a shared host, not a lucky burst inside one time slice
                     budget_s=0.25 if quick else 0.5)


def _timed(fn, device: torch.device, budget_s: float) -> float:
    """Median of 5 repeats: robust to the odd time slice lost to another process on a shared host."""
    probe = time_op(fn, device, warmup=2, iters=1, repeats=3)
    return time_op(fn, device, warmup=1, iters=iters_for(probe, budget_s / 5), repeats=5)


def _matmul_fn(device: torch.device, precision: str, m: int, n: int, k: int):
    if precision == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    dtype = _DTYPES[precision]
    a = torch.randn(m, k, device=device, dtype=dtype)  # (m, k)
    b = torch.randn(k, n, device=device, dtype=dtype)  # (k, n)
    return lambda: torch.mm(a, b)


def bench_matmuls(device: torch.device, precision: str, shapes, budget_s: float, rounds: int = 5,
                  advance=lambda label: None) -> list[MatmulSample]:
    """Every shape timed in ``rounds`` interleaved rounds, median per shape.

    Interleaving spreads any slow spell of the host (another process taking the cores) over all
    shapes instead of letting it bend the efficiency curve of the few measured during it.
    """
    fns = [_matmul_fn(device, precision, m, n, k) for m, n, k in shapes]
    iters = [iters_for(time_op(fn, device, warmup=2, iters=1, repeats=3), budget_s / rounds) for fn in fns]
    times: list[list[float]] = [[] for _ in shapes]
    for r in range(rounds):
        for i, fn in enumerate(fns):
            times[i].append(time_op(fn, device, warmup=0, iters=iters[i], repeats=1))
            if r == rounds - 1:
                m, n, k = shapes[i]
                advance(f"matmul {precision} {m}x{n}x{k}")
    out = []
    for (m, n, k), ts in zip(shapes, times):
        t = statistics.median(ts)
        out.append(MatmulSample(precision=precision, m=m, n=n, k=k, time_s=t, flops_per_s=2.0 * m * n * k / t))
    return out


def bench_attention(device: torch.device, precision: str, batch: int, heads: int, seq_len: int,
                    head_dim: int, budget_s: float) -> AttentionSample:
    """Causal SDPA forward, and forward + backward (dQ, dK, dV of a unit output gradient): the
    backward is their difference, both the median of 5 repeats (half the budget each)."""
    dtype = _DTYPES.get(precision, torch.bfloat16)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.ones(batch, heads, seq_len, head_dim, device=device, dtype=dtype)

    def forward() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), grad)

    t = _timed(forward, device, budget_s / 2)
    t_both = _timed(forward_backward, device, budget_s / 2)
    flops = 2 * 2.0 * batch * heads * seq_len * seq_len * head_dim / 2
    return AttentionSample(precision=precision, batch=batch, heads=heads, seq_len=seq_len,
                           head_dim=head_dim, time_s=t, flops_per_s=flops / t,
                           backward_s=max(t_both - t, 0.0))


def bench_bandwidth(device: torch.device, op: str, nbytes: int, budget_s: float) -> BandwidthSample:
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    if op == "copy":
        fn, moved = (lambda: dst.copy_(src)), 2 * n * 4  # read + write
    else:
        other = torch.rand(n, device=device)
        fn, moved = (lambda: torch.add(src, other, out=dst)), 3 * n * 4  # two reads + write
    t = _timed(fn, device, budget_s)
    return BandwidthSample(op=op, bytes=moved, time_s=t, bytes_per_s=moved / t)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def bench_layer_overhead(device: torch.device, budget_s: float) -> float:
    """Fixed forward time of one layer of the runtime's own model, apart from its math.

    Times forward + backward of the layer probe's model (meshplan.calib.layer_probe: D=32,
    8 tokens, FLOPs and bytes negligible) on one process, with 1 and with 5 layers: the difference per layer is the
    dispatch cost of its ~30 operators. The cost model charges ``layer_overhead_s`` once per
    forward and twice per backward (cost/layer.py), hence the division by 3.
    """
    from meshplan.runtime.models.init import init_parameters
    from meshplan.runtime.models.transformer import build_model
    from meshplan.calib.layer_probe import PROBE_MODEL, PROBE_OVERRIDES, PROBE_SEQ_LEN
    from meshplan.spec.presets import model_preset

    def fwd_bwd_s(layers: int) -> float:
        spec = model_preset(PROBE_MODEL).with_overrides({**PROBE_OVERRIDES, "num_layers": layers})
        model = build_model(spec, device="cpu").to(device)
        init_parameters(model, seed=0)
        tokens = torch.randint(0, spec.vocab_size, (1, PROBE_SEQ_LEN), device=device)

        def step() -> None:
            model(tokens).float().sum().backward()

        first = time_op(step, device, warmup=2, iters=1, repeats=1)
        return time_op(step, device, iters=iters_for(first, budget_s / 3), repeats=3)

    few, many = fwd_bwd_s(1), fwd_bwd_s(5)
    return max(0.0, (many - few) / 4 / 3)


def bench_elementwise(device: torch.device, budget_s: float) -> float:
    """Forward + backward of the memory-bound ops of one runtime layer (the elementwise probe):
    the runtime's own modules, as its Transformer block calls them, on (1, T, D) activations.

    Two RMSNorms and residual adds, SwiGLU's silu * up on (1, T, F), the rotary embedding of q and
    k and GQA's repeat of k and v: what the cost model counts as a layer's memory-bound bytes
    (and the rotary / repeat passes it does not), with no matmul in between.
    """
    from meshplan.runtime.models.layers import RMSNorm, apply_rope
    from meshplan.calib.layer_probe import ELEMENTWISE_PROBE, ELEMENTWISE_TOKENS

    D, F, N, K = (ELEMENTWISE_PROBE[k] for k in ("hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads"))
    H, T = D // N, ELEMENTWISE_TOKENS
    norms = [RMSNorm(D).to(device) for _ in range(2)]
    x = torch.randn(1, T, D, device=device, requires_grad=True)
    gate, up = (torch.randn(1, T, F, device=device, requires_grad=True) for _ in range(2))
    q = torch.randn(1, T, N, H, device=device, requires_grad=True)
    k, v = (torch.randn(1, T, K, H, device=device, requires_grad=True) for _ in range(2))
    pos = torch.arange(T, device=device)

    def step() -> None:
        h = x + norms[0](x)  # attention_norm, residual add
        out = h + norms[1](h)  # ffn_norm, residual add
        act = torch.nn.functional.silu(gate) * up
        qr, kr = apply_rope(q, pos), apply_rope(k, pos)
        kr, vr = kr.repeat_interleave(N // K, dim=2), v.repeat_interleave(N // K, dim=2)
        (out.sum() + act.sum() + qr.sum() + kr.sum() + vr.sum()).backward()

    return _timed(step, device, budget_s * 2)


HOST_PROBE_OPS = (8, 40)
"""Chain lengths of the host probe (``bench_host_per_kernel``): the difference of the two removes
the fixed cost of a step (the loss, the backward's start, the graph's teardown)."""


def bench_host_per_kernel(device: torch.device, budget_s: float) -> float:
    """Host time per kernel of eager PyTorch: what one aten op costs the host to issue.

    Forward + backward of a chain of ``y = y * w`` on an 8-element tensor that requires grad:
    each link is one kernel forward (mul) and one backward (the gradient's mul by w), each issued
    through Python (forward only), the dispatcher, autograd (recording the node forward, running it
    backward) and, on CUDA, ``cudaLaunchKernel``; the math is nil, so the time per kernel is the
    host's. On a GPU the device waits for the host and the CUDA events measure the host's issue
    rate (the number ``Calibration.host_s_per_kernel`` stands for, cost/host.py); on a CPU it is the
    same dispatch cost without ``cudaLaunchKernel``, which a GPU's host pays on top (NVIDIA blog
    'Getting Started with CUDA Graphs', 2019: the launch overhead CUDA graphs remove). Two chain lengths,
    the difference per link over its 2 kernels. Python-level module calls of real model code
    (``nn.Module.__call__``, hooks) come on top: this is a lower bound of an eager layer's cost.
    """
    w = torch.full((8,), 1.0, device=device)

    def chain_s(links: int) -> float:
        x = torch.ones(8, device=device, requires_grad=True)

        def step() -> None:
            y = x
            for _ in range(links):
                y = y * w
            y.sum().backward()

        first = time_op(step, device, warmup=2, iters=1, repeats=1)
        return time_op(step, device, iters=iters_for(first, budget_s / 4), repeats=3)

    few, many = HOST_PROBE_OPS
    return max(0.0, (chain_s(many) - chain_s(few)) / (many - few) / 2)
