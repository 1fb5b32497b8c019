"""Long-context attention factors of :class:`~meshplan.cost.calibration.Calibration`
(read by cost/mixers.py): sequence falloff, softmax exp cost, scan efficiency, CP balance.

A base of ``Calibration`` (cost/calibration.py), which holds the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LongContextFields"]


@dataclass(frozen=True, kw_only=True)
class LongContextFields:
    """How fused attention (and scans) scale with sequence length, and the CP split."""

    attention_half_seq: float = 128.0
    """Sequence (KV length seen by one kernel call) at which a non-causal fused attention
    reaches half its large-sequence efficiency: efficiency x s / (s + attention_half_seq).
    FlashAttention-3 forward, H100 bf16, head dim 128, non-causal: ~500 TFLOP/s at 512, ~660 at
    16k (Shah et al. 2024, Fig. 5)."""
    attention_half_seq_causal: float = 1024.0
    """The same for a causal mask, whose diagonal tiles are partly wasted and whose early query
    blocks see few keys: FlashAttention-3 causal, head dim 128: ~200 TFLOP/s at 512, ~530 at 4k,
    ~640 at 16k (Shah et al. 2024, Fig. 5)."""
    attention_backward_ratio: float = 2.0
    """Backward over forward time of the attention core at large S (at equal efficiency): 2.0, the
    FLOP ratio the cost model uses for every op (Narayanan et al. 2021 Sec. 5.1). A hardware
    profile measures it (calib/hwcalib.py: the causal SDPA sweep, forward and backward)."""
    attention_exp_share: float = 0.40
    """Share of the fused attention kernel's forward time that waits on the softmax exponentials
    at attention_exp_reference_per_s (BMM2 waits for the SFUs: NVIDIA blog 'Making Softmax More
    Efficient with NVIDIA Blackwell Ultra', 2026). Derived: GB300's 2x SFU rate gives ~1.35x fp8
    forward on DeepSeek-V3's MLA, 1 / (1 - s + s / 2) = 1.35, s = 0.52 at 640 FLOPs per score at
    the fp8 rate; a bf16 head-dim-128 kernel does 512 FLOPs per score at half that rate (1.6x the
    MMA time), so 0.52 / (0.48 x 1.6 + 0.52) = 0.40. Used only on GPUs with an SFU rate
    (GPUSpec.sfu_exp_per_s); a GPU at the reference rate keeps its efficiency unchanged."""
    attention_backward_exp_share: float = 0.21
    """The same for the backward kernel, which recomputes one exponential per score (P) but runs
    2.5x the forward's MMA FLOPs (Dao 2023, Algorithm 2): 0.52 / (2.5 x 0.48 x 1.6 + 0.52)."""
    attention_exp_reference_per_s: float = 5e12
    """SFU rate at which the attention efficiencies that apply to SFU-rated GPUs were measured:
    B200's 5 TeraExponentials/s (FlashAttention-4 and cuDNN on B200, attention_kernels.json;
    blackwell/megatron's fitted record on B200 / GB200 rows)."""
    attention_exp_reference_head_dim: float = 128.0
    """Head dim at which attention_exp_share and attention_backward_exp_share hold (the bf16
    head-dim-128 kernel of their derivation): the exponentials per MMA FLOP scale as its ratio to
    the layer's head dim (GPT-OSS's 64: twice the share of exponentials per score's MMA)."""
    attention_backward_half_seq: float = 128.0
    """The backward kernel's own sequence falloff, as attention_half_seq (the same FlashAttention-3
    figure by default: the backward then costs attention_backward_ratio x the forward at every S)."""
    attention_backward_half_seq_causal: float = 1024.0
    """The same for a causal mask, as attention_half_seq_causal (Shah et al. 2024, Fig. 5)."""
    mamba_scan_efficiency: float = 0.05
    """Fraction of the bf16 peak the Mamba-2 SSD kernels reach on their FLOPs (cost/mixers.py):
    the chunked scan of Dao & Gu 2024 (Sec. 6-7) runs as five Triton kernels (chunk cumsum,
    chunk state, state passing, BMM, chunk scan) that write and read fp32 per-chunk states of
    n x P x N_s per chunk, small matmuls of the head dim P = 64 and the chunk Q = 128. Roofline:
    per token forward ~3.5 MFLOP over ~100 KB (x, B, C, y in bf16; the fp32 states written,
    passed and read: 3-4 x n*P*N_s*4/Q bytes), ~35 FLOP/B against a bf16 ridge of ~370 FLOP/B
    (H100; B200 alike): memory-bound at ~0.1 of peak with full bandwidth, ~0.05 with the
    backward's recomputation of the states and Triton's share of the bandwidth. Its own
    constant, fitted per (generation, stack) on the hybrid models' rows."""
    cp_causal_balanced: bool = True
    """Context parallel splits a causal sequence in 2c chunks, rank i holding chunks i and
    2c-1-i, so every rank does the same attention work (Megatron-Core's load-balanced CP, the
    'zig-zag' split). False: a contiguous split, where the last rank does (2c-1)/c of the mean."""
